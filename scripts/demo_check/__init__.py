"""`make demo-check`: the compose demo built and run for real on a private
Docker daemon, probed as an operator would, and torn down (see README.md,
"Compose demo")."""
