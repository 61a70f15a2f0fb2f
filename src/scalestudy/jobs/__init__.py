"""Jobs: what starts processes (the launcher, the container, the system inventory, the
profiler capture)."""
