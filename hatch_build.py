"""Wheel build hook: ship the repository's ``tasks/`` as ``lpes_harness/tasks/yaml``.

Only for regular wheels: an editable install reads ``tasks/`` from the checkout, and a
copy inside site-packages would go stale.
"""

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class CustomBuildHook(BuildHookInterface):
    def initialize(self, version, build_data):
        if version == "editable":
            return
        build_data["force_include"]["tasks"] = "lpes_harness/tasks/yaml"
