"""Search profiles: `auto` picks the robust profiles for the packaged models, and for other models the
CPU-sized settings without a GPU; flags and --config still win."""

import json

import pytest

from lpes_harness.commands.search_cli import PROFILES, parse_args

# A model that is neither packaged one (an HF id: nothing is loaded to parse the flags).
OTHER = ["--pretrained", "HuggingFaceTB/another-model"]


@pytest.fixture
def no_native_bf16(monkeypatch):
    """A CPU that only emulates bfloat16 (the AVX2 machines): auto stays in float32."""
    monkeypatch.setattr("lpes_harness.core.models.cpu_has_native_bf16", lambda cpuinfo=None: False)


@pytest.fixture
def native_bf16(monkeypatch):
    monkeypatch.setattr("lpes_harness.core.models.cpu_has_native_bf16", lambda cpuinfo=None: True)
    monkeypatch.setattr("lpes_harness.core.models.cpu_bf16_speedup", lambda: 2.0)


def test_auto_on_cpu_takes_the_cpu_profile(no_native_bf16):
    args = parse_args(["--device", "cpu", *OTHER])
    assert args.profile == "cpu"
    for key, value in PROFILES["cpu"].items():
        assert getattr(args, key) == value, key


def test_auto_on_a_cpu_with_native_bfloat16_takes_the_larger_cpu_search(native_bf16):
    args = parse_args(["--device", "cpu", *OTHER])
    assert args.profile == "cpu-bf16"
    for key, value in PROFILES["cpu-bf16"].items():
        assert getattr(args, key) == value, key
    assert (args.num_samples, args.population, args.generations, args.heldout_samples) == (20, 12, 4, 200)


@pytest.mark.parametrize("flags", [["--dtype", "float32"], ["--model-args", "dtype=float32"]])
def test_a_float32_search_on_that_cpu_keeps_the_float32_sized_profile(native_bf16, flags):
    assert parse_args(["--device", "cpu", *OTHER, *flags]).profile == "cpu"


def test_a_config_files_dtype_chooses_the_cpu_profile_too(native_bf16, tmp_path):
    config = tmp_path / "search.json"
    config.write_text(json.dumps({"dtype": "float32"}))
    assert parse_args(["--device", "cpu", *OTHER, "--config", str(config)]).profile == "cpu"
    assert parse_args(["--device", "cpu", *OTHER, "--config", str(config), "--dtype", "bfloat16"]).profile == "cpu-bf16"


def test_the_dtype_given_twice_is_one_line_before_anything_loads(capsys):
    with pytest.raises(SystemExit) as stop:
        parse_args(["--device", "cpu", "--dtype", "bfloat16", "--model-args", "dtype=float32"])
    assert stop.value.code == 2 and "give the dtype once" in capsys.readouterr().err


def test_every_cpu_profile_is_a_valid_search():
    from lpes_harness.search.validate import check_search_args

    for name in ("cpu", "cpu-bf16", "gemma3-cpu", "gemma3-base-cpu", "robust-smollm2", "robust-smollm2-gpu",
                 "robust-gemma3", "racing-gemma3"):
        args = parse_args(["--device", "cpu", "--profile", name])
        check_search_args(args)
        if args.search_method == "ga":
            assert args.population == args.parents + args.mutants + args.crossovers, name


def test_the_paper_profile_keeps_the_papers_settings():
    args = parse_args(["--device", "cuda", "--profile", "paper"])
    assert args.profile == "paper" and args.task == "kv_retrieval"
    assert (args.population, args.parents, args.mutants, args.crossovers, args.generations) == (32, 12, 16, 4, 20)
    assert (args.num_samples, args.fitness, args.y_min, args.y_max, args.initial_y) == (200, "greedy", 1.0, 2.0, 1.5)


def test_auto_on_a_gpu_takes_the_multi_needle_search_at_the_papers_size():
    args = parse_args(["--device", "cuda", *OTHER])
    assert args.profile == "gpu" and args.task == "multi_needle"
    assert (args.population, args.parents, args.mutants, args.crossovers, args.generations) == (32, 12, 16, 4, 20)
    assert (args.y_min, args.y_max, args.num_samples) == (0.25, 2.5, 100)


def test_the_command_line_and_a_config_file_override_the_profile(no_native_bf16, tmp_path):
    config = tmp_path / "search.json"
    config.write_text(json.dumps({"generations": 7, "fitness": "logprob"}))
    # population = parents + the profile's crossovers and mutants (1 + 4)
    args = parse_args(["--device", "cpu", *OTHER, "--config", str(config), "--population", "11", "--parents", "6"])
    assert (args.generations, args.fitness, args.population, args.parents) == (7, "logprob", 11, 6)
    assert args.num_samples == PROFILES["cpu"]["num_samples"]  # untouched: still the profile's


def test_a_config_file_can_choose_the_profile(tmp_path):
    config = tmp_path / "search.json"
    config.write_text(json.dumps({"profile": "paper"}))
    assert parse_args(["--device", "cpu", "--config", str(config)]).num_samples == 200


def test_an_unknown_profile_in_a_config_file_is_named(tmp_path, capsys):
    config = tmp_path / "search.json"
    config.write_text(json.dumps({"profile": "laptop"}))
    with pytest.raises(SystemExit):
        parse_args(["--config", str(config)])
    assert "profile 'laptop' is not one of auto, paper, cpu, cpu-bf16, gemma3-cpu, gemma3-base-cpu, gpu" in capsys.readouterr().err


def test_the_command_lines_device_decides_auto_over_the_config_files(no_native_bf16, tmp_path):
    config = tmp_path / "search.json"
    config.write_text(json.dumps({"device": "cpu"}))
    assert parse_args(["--config", str(config), "--device", "cuda", *OTHER]).profile == "gpu"
    assert parse_args(["--config", str(config), *OTHER]).profile == "cpu"


@pytest.mark.parametrize("name", ["smollm2_demo.json", "smollm2_reference.json"])
def test_the_shipped_configs_are_valid_multi_needle_searches_over_the_wide_range(name):
    """The README sends users to these files: every key must be a flag, and the values a valid search."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "searches" / "configs" / name
    saved = json.loads(path.read_text())
    args = parse_args(["--device", "cpu", "--config", str(path)])
    assert args.task == "multi_needle" and (args.y_min, args.y_max) == (0.25, 2.5)
    assert (args.population, args.num_samples, args.generations) == (
        saved["population"], saved["num_samples"], saved["generations"])


def test_a_tiebreak_that_could_outweigh_a_sample_is_one_line_before_anything_loads(capsys):
    with pytest.raises(SystemExit) as stop:
        parse_args(["--device", "cpu", "--fitness", "tiebreak", "--num-samples", "100000"])
    assert stop.value.code == 2 and "fitness tiebreak: one sample is worth only" in capsys.readouterr().err


def test_the_objective_is_a_flag_and_an_unknown_one_is_refused(capsys):
    assert parse_args(["--device", "cpu"]).objective == "weighted"  # the paper's
    assert parse_args(["--device", "cpu", "--objective", "ranked"]).objective == "ranked"
    with pytest.raises(SystemExit) as stop:
        parse_args(["--device", "cpu", "--objective", "worst"])
    assert stop.value.code == 2 and "invalid choice: 'worst'" in capsys.readouterr().err


def test_the_heldout_table_scales_with_the_search_unless_set(tmp_path, native_bf16):
    """A quick search gets a quick table: the profile's 200 per position is for its 20 search samples."""
    assert parse_args(["--profile", "cpu-bf16"]).heldout_samples == 200
    assert parse_args(["--profile", "cpu-bf16", "--num-samples", "2"]).heldout_samples == 20
    assert parse_args(["--profile", "cpu", "--num-samples", "2"]).heldout_samples == 7  # 40 x 2/12, rounded up
    assert parse_args(["--profile", "paper", "--num-samples", "2"]).heldout_samples == 0
    assert parse_args(["--profile", "cpu-bf16", "--num-samples", "2", "--heldout-samples", "50"]).heldout_samples == 50
    config = tmp_path / "search.json"
    config.write_text(json.dumps({"num_samples": 2, "heldout_samples": 0}))
    assert parse_args(["--profile", "cpu-bf16", "--config", str(config)]).heldout_samples == 0


@pytest.mark.parametrize("name", ["gemma3-270m", "Gemma-3-270M", "gemma3"])
def test_auto_gives_gemma3_its_race(native_bf16, name):
    # At multi_needle's default haystack Gemma-3-270M scores 1.00 everywhere: nothing to search for;
    # at 240 and 480 sentences it shows the bias. A larger RoPE base on every layer removed it at 240, position
    # factors on the global layers helped at 480: the race draws both, the sliding layers' positions held.
    args = parse_args(["--device", "cpu", "--pretrained", name])
    assert args.profile == "racing-gemma3" and args.search_method == "racing" and args.every_item
    assert args.task == "multi_needle" and args.draw_range == (240, 480)
    assert [c.metadata["num_sentences"] for c in args.conditions] == [240, 480]  # uniform.json's fitness
    assert args.scaling == "both" and args.position_layer_type == "full_attention" and args.layer_type is None
    assert (args.y_min, args.y_max, args.base_y_min, args.base_y_max) == (1.0, 3.0, 1.0, 8.0)
    assert args.validation_samples == 0 and args.uniform_tuning
    assert parse_args(["--device", "cpu", "--pretrained", name, "--profile", "gemma3-cpu"]).scaling == "position"
    assert parse_args(["--device", "cpu", "--pretrained", name, "--profile", "robust-gemma3"]).scaling == "base"
    assert parse_args(["--device", "cuda", "--pretrained", name]).profile == "racing-gemma3"  # on a GPU too
    assert parse_args(["--device", "cpu"]).profile == "racing-smollm2"  # SmolLM2 has its own


def test_a_local_folder_named_like_a_short_name_is_not_the_packaged_gemma(native_bf16, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gemma3").mkdir()
    (tmp_path / "gemma3" / "config.json").write_text("{}")  # a model folder (an empty one is refused as none)
    assert parse_args(["--device", "cpu", "--pretrained", "gemma3"]).profile == "cpu-bf16"


def test_a_users_metadata_adds_to_the_profiles_task_options(native_bf16):
    args = parse_args(["--device", "cpu", "--pretrained", "gemma3-270m", "--metadata", '{"num_needles": 4}'])
    assert args.metadata == {"num_sentences": 240, "num_needles": 4}
    args = parse_args(["--device", "cpu", "--pretrained", "gemma3-270m", "--metadata", '{"num_sentences": 120}'])
    assert args.metadata == {"num_sentences": 120}


def test_the_heldout_tables_extra_rows_are_chosen_or_named_when_wrong(native_bf16, tmp_path, capsys):
    assert parse_args(["--device", "cpu"]).heldout_extra == ("pi", "uniform")
    assert parse_args(["--device", "cpu", "--heldout-extra", "none"]).heldout_extra == ()
    assert parse_args(["--device", "cpu", "--heldout-extra", "Uniform"]).heldout_extra == ("uniform",)
    config = tmp_path / "demo.json"
    config.write_text(json.dumps({"heldout_extra": ["pi"]}))
    assert parse_args(["--device", "cpu", "--config", str(config)]).heldout_extra == ("pi",)
    # 'none' is saved as an empty list (config.json's settings): a resume reads it back as none.
    config.write_text(json.dumps({"heldout_extra": []}))
    assert parse_args(["--device", "cpu", "--config", str(config)]).heldout_extra == ()
    with pytest.raises(SystemExit) as stop:
        parse_args(["--device", "cpu", "--heldout-extra", "pi,buckets"])
    assert stop.value.code == 2 and "--heldout-extra 'pi,buckets': give 'none' or a comma list of pi, uniform" in capsys.readouterr().err


def test_scaling_given_twice_must_agree(capsys):
    assert parse_args(["--device", "cpu", "--scaling", "base", "--model-args", "scaling=base"]).scaling == "base"
    with pytest.raises(SystemExit) as stop:
        parse_args(["--device", "cpu", "--profile", "cpu", "--model-args", "scaling=base"])
    assert stop.value.code == 2
    assert "--model-args scaling=base and --scaling position disagree; give --scaling only" in capsys.readouterr().err


def test_auto_gives_the_bundled_smollm2_its_larger_robust_search_on_a_gpu():
    # The CPU robust profile's curve lost at 120 and 180 sentences; the GPU one searches 120 too, on twice the
    # samples. On a CPU auto races lines instead (under an hour); robust-smollm2 stays a profile to name.
    gpu, cpu = parse_args(["--device", "cuda"]), parse_args(["--device", "cpu", "--profile", "robust-smollm2"])
    assert (parse_args(["--device", "cpu"]).profile, gpu.profile) == ("racing-smollm2", "robust-smollm2-gpu")
    assert [c.name for c in gpu.conditions] == ["60 sentences", "120 sentences", "240 sentences", "16 needles"]
    assert gpu.num_samples == 2 * cpu.num_samples and gpu.scaling == cpu.scaling == "both"
    assert gpu.validation_samples > 0 and gpu.uniform_tuning
