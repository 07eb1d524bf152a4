"""Named systems: each a bundle of an admission and an eviction policy, and a tuner.

```python
cache = make_cache(PAPER_7B, "2GB", "marconi")     # a PrefixCache running the system
tuner = get_system("marconi").make_tuner()         # the driver calls tuner.observe(...)
```
The mechanism is `registry.py`; each family's registrations live beside it (`paper.py`,
`engines.py`, `plus.py`, `baselines.py`), imported here in that order (the order systems
are listed in). Every registration is one line of metadata and a factory that imports
its policy family when called, so listing the systems (CLI choices, tests parametrized
over the registry) loads no policy module, and no policy module imports this package.
Adding a policy: one module in its family, one `@system(...)` factory in its family's
module here (docs/architecture.md).
"""

from __future__ import annotations

import importlib

from marconi.systems.registry import (
    SYSTEMS,
    UNBOUNDED_PLANNER,
    LayoutFactory,
    Option,
    Policies,
    PolicyFactory,
    Settings,
    System,
    TunerFactory,
    TunerOptions,
    base_name,
    configured,
    configured_base,
    get_system,
    load_plugin,
    make_cache,
    parse_settings,
    register,
    register_configurable,
    settings_name,
    split_systems,
    system,
)

FAMILIES = ("paper", "engines", "plus", "baselines")  # registered in this order
for _family in FAMILIES:
    importlib.import_module(f"marconi.systems.{_family}")

__all__ = ["FAMILIES", "SYSTEMS", "UNBOUNDED_PLANNER", "LayoutFactory", "Option", "Policies",
           "PolicyFactory", "Settings", "System", "TunerFactory", "TunerOptions", "base_name",
           "configured", "configured_base", "get_system", "load_plugin", "make_cache",
           "parse_settings", "register", "register_configurable", "settings_name",
           "split_systems", "system"]
