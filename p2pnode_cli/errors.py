"""What a command does when it fails: a message the user can act on and an exit status."""

from p2pnode.exits import EXIT_FAILED, EXIT_OK, EXIT_USAGE

__all__ = ["EXIT_OK", "EXIT_FAILED", "EXIT_USAGE", "CommandError"]


class CommandError(Exception):
    """A failure the user can act on; printed as `p2pnode: error: <message>`."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code
