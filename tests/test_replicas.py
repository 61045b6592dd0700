"""Two replicas on a CPU: what only several replicas show (strategy=mirrored splits the CPU into two logical devices).

A process splits its CPU before TensorFlow starts, and this one has started it, so one child process takes
strategy=mirrored for every test here and reports each case on its last line, as JSON.
"""
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import PROJECT
from tests.refusals import assert_names
from tests.shared_runs import SMOKE

CHILD = """
import json, sys
import numpy as np, tensorflow as tf
from tf_harness.experiments import api
from tf_harness.experiments.config import strategies
from tf_harness.experiments.config.settings import Settings
from tests.conftest import compose

run_dir, tiny, found = sys.argv[1], json.loads(sys.argv[2]), {}
for case, overrides in {"batch": ["pipeline.batch_size=3"], "xla": ["trainer.jit_compile=true"]}.items():
    try:
        api.run([*tiny, "strategy=mirrored", *overrides], run_dir=f"{run_dir}/{case}")
        found[case] = ["ran", ""]
    except Exception as error:
        found[case] = [type(error).__name__, str(error)]

strategy = strategies.make_strategy(compose("strategy=mirrored").strategy)
preprocess = Settings.from_config(compose("dataset=imagenet_det")).preprocessing()
images = tf.constant(np.random.default_rng(0).integers(0, 256, (4, 8, 8, 3), np.uint8))
out = strategy.run(tf.function(lambda: preprocess(images, training=True, step=tf.constant(1, tf.int64))))
first, second = (t.numpy() for t in strategy.experimental_local_results(out))
found["draws"] = [strategy.num_replicas_in_sync, not np.array_equal(first, second)]
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def two_replicas(tmp_path_factory):
    """{case: what the child found} for the cases of CHILD."""
    run_dir = tmp_path_factory.mktemp("replicas")
    done = subprocess.run([sys.executable, "-c", CHILD, str(run_dir), json.dumps(SMOKE["chest_xray"])], cwd=PROJECT,
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_replicas_draw_differently(two_replicas):
    """The same images on two replicas at one step get different flips and brightness."""
    assert two_replicas["draws"] == [2, True]


@pytest.mark.parametrize("case, named", [("batch", ["pipeline.batch_size=3"]),
                                         ("xla", ["trainer.jit_compile=true", "one replica"])])
def test_what_several_replicas_cannot_run_is_one_config_error(two_replicas, case, named):
    """A batch that does not divide across the replicas, and XLA under several replicas: the config error the
    command line prints and exits 2 on (api.run's RunConfigError), naming the key."""
    kind, line = two_replicas[case]
    assert kind == "RunConfigError", (kind, line)
    assert_names(line, *named)
    assert "\n" not in line
