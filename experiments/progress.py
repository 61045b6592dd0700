"""Log lines and tqdm's progress bars on one terminal: a line logged while a bar is drawn goes above it."""
import functools

from tqdm.contrib.logging import logging_redirect_tqdm


def logs_above_the_bar(method):
    """Log lines printed while `method` runs go above its tqdm bar instead of through it; run.log is untouched."""
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        with logging_redirect_tqdm():
            return method(*args, **kwargs)
    return wrapper
