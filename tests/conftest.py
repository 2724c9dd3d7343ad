"""Settings every test's servers inherit."""

import os

# The suite runs several servers (and concurrent clients) on a 2-core host; one scheduler
# thread each keeps their OpenMP barriers from stalling behind one another. Serving uses
# every core of a small host by default (nanospec_server/host.py).
os.environ.setdefault("NANOSPEC_CPU_THREADS", "1")
