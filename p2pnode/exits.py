"""The exit statuses of the `p2pnode` command and of a daemon's process (docs/config.md, exit codes).

Here, below everything, so that the daemon, the launcher (which must not restart a daemon that
exited 0 or 2) and the command line say the same thing."""

EXIT_OK = 0  # done what was asked
EXIT_FAILED = 1  # the command failed; the message says why and what to do
EXIT_USAGE = 2  # bad usage, an invalid configuration file or a key file that cannot be used
