"""A trainer process for tests/local/test_waits.py: one step line on stdout, which it then
closes a while before it exits (as a process ending slowly does), then exit 0."""

import os
import sys
import time

print('{"step": 1}', flush=True)
sys.stdout.close()
os.close(1)
time.sleep(1)  # the end of its output is not its end
