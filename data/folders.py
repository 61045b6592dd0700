"""Walking a dataset's folder tree, as the datasets' indexes do."""
import logging

log = logging.getLogger(__name__)


def is_folder(entry) -> bool:
    """Whether a scandir entry is a folder, following a symbolic link; one that cannot be followed (a link to
    itself, a loop too deep) is logged and taken as no folder."""
    try:
        return entry.is_dir()
    except OSError as error:
        log.warning("Skipped %s: %s", entry.path, error.strerror)
        return False
