"""`tf-harness-tfrecords dataset=... [tfrecord.encoding=raw ...]`, or `python -m tf_harness.data.tfrecords ...`:
converts a dataset to TFRecord shards.

The converter's command line; a config error is one line on stderr and exit
status 2, as for run.py. As an entry point it may use the command line's
conventions in experiments/; the data package itself never does.
"""
import sys

# First, as in run.py: it sets TensorFlow's environment before TensorFlow is imported, so the converter
# starts as quietly as a run does, and reports a bad config before TensorFlow starts.
from tf_harness.experiments import cli

cli.setup()  # as in run.py: the entry point's one call, before TensorFlow or Hydra starts

import hydra  # noqa: E402


def convert_configured(settings, job, actions):
    """cli.guarded's task: converts the dataset `settings` name (`job` and `actions` are a training run's)."""
    # TensorFlow starts here, once cli.guarded has passed the config.
    from tf_harness.data.tfrecords.writer import convert
    from tf_harness.experiments.config import strategies

    workers, _ = strategies.workers()
    convert(settings.task(), settings.tfrecords(), settings.seed, settings.pipeline.verify_images,
            settings.dataset.max_skipped_fraction, workers)


@hydra.main(config_path="pkg://tf_harness.conf", config_name="config", version_base="1.3")
def main(cfg):
    cli.job(convert_configured, cfg)  # a re-entered run directory's saved config, checked, as in run.py


def compose_and_run():
    args = sys.argv[1:]  # as in run.py: a single conversion through cli.single_run, Hydra's flags through main
    if cli.hydra_main_needed(args):
        main()
    else:
        cli.single_run(args, convert_configured)


def command() -> int:
    """The `tf-harness-tfrecords` command; returns the exit status."""
    return cli.exit_code(compose_and_run)


if __name__ == "__main__":
    sys.exit(command())
