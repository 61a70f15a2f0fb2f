"""Stand-in for torchrun in gpu-check's tests: starts one "rank" in a session of its own (as
torch.distributed's SubprocessHandler does), which writes its pid to the file named by
argv[1]; both then sleep until killed."""

import subprocess
import sys
import time

RANK = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)"

subprocess.Popen([sys.executable, "-c", RANK, sys.argv[1]], start_new_session=True)
time.sleep(120)
