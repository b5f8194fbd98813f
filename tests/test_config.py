"""Environment knobs are validated up front, at ``import spmdnet``: a bad
value fails at once naming the variable, the value and what is accepted."""
import os
import subprocess
import sys

import pytest

from spmdnet import config

BAD = [("SPMDNET_WATCHDOG_S", "abc", "seconds >= 0"),
       ("SPMDNET_WATCHDOG_S", "-5", "seconds >= 0"),
       ("SPMDNET_WATCHDOG_ABORT_S", "abc", "seconds >= 0"),
       ("SPMDNET_EXIT_TIMEOUT_S", "nan", "seconds >= 0"),
       ("SPMDNET_LOG_LEVEL", "foo", "debug, info, warning, error"),
       ("SPMDNET_DEVICE", "tpu", "auto, cpu, gpu"),
       ("SPMDNET_KERNELS", "cuda", "numba, xp"),
       ("SPMDNET_ABORT_ON_ERROR", "maybe", "1, 0"),
       ("SPMDNET_CUDA_AWARE", "2", "1, 0, auto")]


@pytest.mark.parametrize("name,value,accepted", BAD)
def test_a_bad_knob_raises_naming_variable_value_and_choices(name, value, accepted):
    with pytest.raises(ValueError) as info:
        config.check_environment({name: value})
    message = str(info.value)
    assert name in message and repr(value) in message and accepted in message


def test_good_values_pass_and_unknown_names_warn():
    good = {"SPMDNET_WATCHDOG_S": "0", "SPMDNET_WATCHDOG_ABORT_S": "12.5",
            "SPMDNET_LOG_LEVEL": "info", "SPMDNET_DEVICE": "CPU", "SPMDNET_KERNELS": "xp",
            "SPMDNET_CACHE_DIR": "/any/path", "SPMDNET_DEBUG_COLLECTIVES": "1", "PATH": "x"}
    config.check_environment(good)
    with pytest.warns(UserWarning, match="SPMDNET_WATCHDOG is not an spmdnet knob"):
        config.check_environment({"SPMDNET_WATCHDOG": "60"})


def test_import_fails_at_once_on_a_bad_knob():
    env = dict(os.environ, SPMDNET_WATCHDOG_ABORT_S="abc")
    proc = subprocess.run([sys.executable, "-c", "import spmdnet"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "SPMDNET_WATCHDOG_ABORT_S='abc'" in proc.stderr
