"""Model families from other distributions: objects named by entry points in the group `lm_tuner.families`.

The registry loads them once, when it is first used (models.families). A plugin that fails to import or describes
itself wrongly does not stop the others: its error is kept under the entry point's name, which is the family's
name, and raised when that family is asked for (docs/families.md).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata

from lm_tuner.models.families import Family

ENTRY_POINT_GROUP = "lm_tuner.families"


class FamilyPluginError(ValueError):
    """A family plugin that could not be loaded: its entry point, its distribution and what went wrong."""


def load_family_plugins(register: Callable[[Family], Family]) -> dict[str, FamilyPluginError]:
    """Registers the family of every entry point in `ENTRY_POINT_GROUP`, in the order they are found; returns the
    error of each that failed, by entry-point name."""
    errors: dict[str, FamilyPluginError] = {}
    for entry_point in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            register(_described_family(entry_point))
        except Exception as error:  # whatever a plugin raises, the other families must still load
            errors[entry_point.name] = _plugin_error(entry_point, error)
    return errors


def _described_family(entry_point: metadata.EntryPoint) -> Family:
    """The `Family` the entry point names: the object itself, or what calling it returns."""
    loaded = entry_point.load()
    described = loaded() if callable(loaded) and not isinstance(loaded, Family) else loaded
    if not isinstance(described, Family):
        raise TypeError(f"got {type(described).__name__}; allowed: a Family or a callable returning one")
    if described.name != entry_point.name:
        raise ValueError(f"name: the family is called {described.name!r}; allowed: the entry point's name, "
                         f"{entry_point.name!r}")
    return described


def _plugin_error(entry_point: metadata.EntryPoint, error: Exception) -> FamilyPluginError:
    distribution = entry_point.dist.name if entry_point.dist is not None else "an unknown distribution"
    plugin_error = FamilyPluginError(
        f"family plugin {entry_point.name!r} (entry point {entry_point.value!r} in group {ENTRY_POINT_GROUP!r}, "
        f"distribution {distribution}) failed to load: {type(error).__name__}: {error}")
    plugin_error.__cause__ = error
    return plugin_error
