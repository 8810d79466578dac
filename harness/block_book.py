"""Moved to harness.kit.block_book (the engine kit); this name stays for a release."""
from __future__ import annotations

import warnings

from harness.kit.block_book import BlockBook, Live

warnings.warn("harness.block_book moved to harness.kit.block_book; import BlockBook and Live from there",
              DeprecationWarning, stacklevel=2)
