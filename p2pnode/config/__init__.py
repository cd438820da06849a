"""Node configuration: a TOML file, checked completely before anything starts.

Each setting is declared once, as a dataclass field with its kind, default and documentation
(the framework: p2pnode/options.py), in the section of the part it configures: [node] in
sections.py, the others in `wire/`, `discovery/`, `learning/` and `operations/` (each a
`settings.py`), and so is each rule between settings of one section (the section's `check`).
This package puts the sections together (sections.py), loads a file (loading.py) and runs the
sections' rules and the rules that need two or more sections (checks.py); every problem names its
field (`[discovery].max_peers: ...`); all problems are reported at once."""

from ..options import ConfigError
from .loading import load_config, reference_markdown
from .sections import CONTROL_SOCKET_NAME, Config, NodeSettings

__all__ = ["ConfigError", "Config", "NodeSettings", "load_config", "reference_markdown", "CONTROL_SOCKET_NAME"]
