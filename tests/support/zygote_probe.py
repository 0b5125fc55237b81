"""What a zygote's child reports of itself (tests/integration/test_zygote.py): its arguments, an
environment variable, whether it leads a session of its own; then it exits with the code asked,
or sleeps until killed."""

import os
import sys
import time

print(sys.argv[1:], os.environ.get("PROBE"), os.getsid(0) == os.getpid(), flush=True)
if sys.argv[1] == "sleep":
    time.sleep(3600)
sys.exit(int(sys.argv[1]))
