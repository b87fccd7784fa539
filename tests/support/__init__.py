"""What the tests share to reach a service: free ports, waiting on a
condition (never on time), client timeouts that hold on a busy machine, and
the command line in a child process."""
