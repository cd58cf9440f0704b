"""What ``lpes-eval`` registers with lm-eval, and the harness's part of its ``--help``.

The command: :mod:`lpes_harness.commands.eval`.
"""

from __future__ import annotations


def register() -> None:
    """Register our lm-eval models (lazily: nothing heavy is imported here) and tasks, and
    install the early checks: what the start-up hook does, now for the lm-eval modules
    already imported and on import for the others (lm-eval's task index is not built here)."""
    from lpes_harness.lmeval import startup as _startup

    _startup.install()


def harness_help() -> str:
    """What this harness adds to lm-eval, for ``lpes-eval --help``: lm-eval's own help names none of it.
    Read from the table of methods and the task registry, so a new method or task shows up here."""
    from lpes_harness.methods import METHODS
    from lpes_harness.tasks import BUILTIN_POSITION_TASKS, TASKS_DIR
    from lpes_harness.tasks.position import COMMON_OPTIONS, resolve_task

    models: dict[str, list[str]] = {}
    for method in METHODS.values():
        models.setdefault(method.lm_eval, []).append(method.label)
    lines = ["", "lpes-harness adds (to lpes-eval and to plain lm_eval alike):", "  models (--model):"]
    lines += [f"    {name}: {', '.join(labels)}" for name, labels in models.items()]
    stacking = [method.lm_eval for method in METHODS.values() if method.stacks_with_lpes]
    lines.append(f"    an LPES curve under one of {', '.join(stacking)}: lpes_scales= (as lpes_hf's scales=), "
                 f"lpes_scaling= (docs/baselines.md)")
    lines.append("  position tasks (--tasks GROUP, or one gold position: GROUP_pos<percent>), their --metadata keys:")
    for name in BUILTIN_POSITION_TASKS:
        task = resolve_task(name)
        options = ", ".join(f"{key} (default {'set by the data' if value is None else value})"
                            for key, value in task.options.items())
        lines.append(f"    {name}: positions {', '.join(map(str, task.positions))} %; {options}")
    lines.append(f"    and every position task: {', '.join(COMMON_OPTIONS)}")
    suites = sorted(path.name for path in (TASKS_DIR / "suites").iterdir() if path.is_dir())
    lines.append(f"  suites on local data ($LPES_DATA or --metadata data_path): {', '.join(suites)}")
    lines += ["  e.g. (the bundled SmolLM2 when no pretrained= is given):",
              "    lpes-eval --model lpes_hf --model_args scales=1.2 --tasks multi_needle --apply_chat_template \\",
              "        --metadata '{\"num_samples\": 20}'"]
    return "\n".join(lines)
