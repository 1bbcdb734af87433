"""`cli` by its bare name, for code that puts `conversion/` on `sys.path`:
the module itself is `attention_zoo_keras.conversion.cli` (this name is bound
to it, so attributes patched through either name are the same)."""

import sys

from attention_zoo_keras.conversion import cli

sys.modules[__name__] = cli
