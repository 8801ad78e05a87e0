"""Families are plug-ins of the config: registering one makes `model.<name>` a section of YAML,
the command line and `--help`; the config room names no family and validation changes nothing."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Literal

import pytest
import yaml
from _paths import fixtures_root

from raytrain_vla.config import ConfigError, from_tree, load_config, to_dict
from raytrain_vla.config import families as config_families
from raytrain_vla.config.families import FamilyOptions
from raytrain_vla.config.help import format_config_help
from raytrain_vla.config.validate import validate
from raytrain_vla.models import registry
from raytrain_vla.models.toy_mlp.family import ToyMLPFamily

Kind = Literal["narrow", "wide"]


@dataclass(frozen=True)
class PluginOptions(FamilyOptions):
    """`model.plugin_mlp`: a family registered at run time, as another package would."""

    DEFAULT_CHUNK_SIZE: ClassVar[int] = 5
    MOVED_KEYS: ClassVar[dict[str, str]] = {"model.plugin_width": "model.plugin_mlp.width"}

    width: int = 12  # hidden width of the plug-in
    kind: Kind = "narrow"  # a choice the decoder checks


class PluginFamily(ToyMLPFamily):
    name = "plugin_mlp"
    options_type = PluginOptions


@pytest.fixture()
def plugin():
    """Register the plug-in family for one test, then restore both registries."""
    saved = (dict(registry.FAMILIES), dict(registry.LAZY_FAMILIES), config_families._SECTIONS)
    config_families._SECTIONS = dict(config_families._SECTIONS)
    registry.register_family(PluginFamily())
    yield PluginFamily.name
    registry.FAMILIES.clear()
    registry.FAMILIES.update(saved[0])
    registry.LAZY_FAMILIES.clear()
    registry.LAZY_FAMILIES.update(saved[1])
    config_families._SECTIONS = saved[2]


def test_a_registered_family_is_selectable_from_yaml_and_the_command_line(plugin, tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"model": {"type": plugin, plugin: {"width": 7}}}))
    cfg = load_config(path, ["--model.plugin_mlp.kind=wide"])
    assert cfg.model.options == PluginOptions(width=7, kind="wide")
    assert cfg.data.chunk_size == 5  # the family's default chunk
    assert to_dict(cfg)["model"][plugin] == {"width": 7, "kind": "wide"}
    with pytest.raises(ConfigError, match=r"model.plugin_mlp.kind': 'huge', expected one of"):
        load_config(None, ["--model.type=plugin_mlp", "--model.plugin_mlp.kind=huge"])
    with pytest.raises(ConfigError, match=r"'model.plugin_width' \(it moved to 'model.plugin_mlp"):
        load_config(None, ["--model.plugin_width=3"])


def test_help_lists_each_family_s_keys_under_its_own_heading(plugin):
    text = format_config_help("raytrain-vla train", "train", [])
    for name in registry.family_names():
        assert f"\n[model.{name}]" in text, name
    heading = "[model.plugin_mlp] `model.plugin_mlp`: a family registered at run time"
    assert heading in text
    assert "--model.plugin_mlp.width int (default: 12)" in text
    assert "hidden width of the plug-in" in text


def test_an_unknown_model_type_names_the_registered_ones():
    with pytest.raises(ConfigError, match=r"'model.type': 'smolvl', expected one of \("):
        load_config(None, ["--model.type=smolvl"])


def test_only_the_selected_family_s_options_are_used_and_others_are_refused():
    with pytest.raises(ConfigError, match=r"'model.flow_vla.max_text_len': 0, expected a posit"):
        load_config(None, ["--model.flow_vla.max_text_len=0"])
    with pytest.raises(
        ConfigError, match=r"'model.flow_vla' options \{'max_text_len': 9\} are set"
    ):
        load_config(None, ["--model.type=toy_mlp", "--model.flow_vla.max_text_len=9"])
    assert load_config(None, ["--model.type=toy_mlp"]).model.type == "toy_mlp"


def test_validation_leaves_the_config_as_it_was():
    tree = to_dict(load_config(None, ["--data.mixture=[{root: demo}, {root: /x/arm}]"]))
    cfg = from_tree(copy.deepcopy(tree))
    assert [e.name for e in cfg.data.mixture] == ["demo", "arm"]  # filled by the loader
    before = copy.deepcopy(to_dict(cfg))
    validate(cfg)
    assert to_dict(cfg) == before


def test_another_family_s_options_do_not_change_the_recipe():
    """The hash covers the selected family's section only (a config saved by an older version
    held every family's), so a new family never changes an existing run's recipe."""
    from raytrain_vla.config import recipe_hash

    base = load_config()
    other = load_config()
    other.model.sections["toy_mlp"] = dataclasses.replace(other.model.toy_mlp, hidden=3)
    assert recipe_hash(other) == recipe_hash(base)
    assert recipe_hash(load_config(None, ["--model.flow_vla.max_text_len=9"])) != recipe_hash(base)


def test_fine_tuning_a_lerobot_checkpoint_takes_its_chunk_unless_one_is_given():
    pretrained = fixtures_root() / "lerobot_smolvla_tiny" / "pretrained_model"
    args = ["--model.type=smolvla", f"--model.init_from={pretrained}"]
    assert load_config(None, args).data.chunk_size == 10  # LeRobot's config.json says 10
    assert load_config(None, [*args, "--data.chunk_size=20"]).data.chunk_size == 20
    assert load_config(None, ["--model.type=smolvla"]).data.chunk_size == 50  # no checkpoint


def test_the_preflight_says_where_the_chunk_came_from():
    """A note the driver prints before Ray starts, only when the checkpoint chose the chunk."""
    from raytrain_vla.train.preflight import _chunk_findings

    pretrained = fixtures_root() / "lerobot_smolvla_tiny" / "pretrained_model"
    cfg = load_config(None, ["--model.type=smolvla", f"--model.init_from={pretrained}"])
    [finding] = _chunk_findings(cfg)
    assert "data.chunk_size 10 is the chunk_size of model.init_from's config.json" in str(finding)
    given = load_config(None, ["--model.type=smolvla", "--data.chunk_size=12"])
    assert _chunk_findings(given) == []
