"""The published ``ilge`` 0.1.0 package's ``recommended_config`` checks, ported with only the import changed.

The published tests' source is not in this repository; these are the checks its README and its
"Defaults by model size" table state (lr 1e-3 up to ~1B, 1e-4 above 3B, one GNN layer, hidden 256,
the config classes' own defaults otherwise). No defaults file is patched away: ``recommended_config``
returns the published values whatever the shipped or the user's defaults files say.
"""

from __future__ import annotations

import json

from ilge_search import CayleyConfig, DeepSetConfig, FCConfig  # ported: was `from ilge import ...`
from ilge_search.tuning import recommended_config  # ported: was `from ilge.tuning import recommended_config`


def test_recommended_config_small_and_large():
    cfg = recommended_config("cayley")  # lr=1e-3 (small models)
    assert isinstance(cfg, CayleyConfig)
    assert cfg.lr == 1e-3
    assert cfg.gnn_layers == 1 and cfg.hidden_dim == 256
    cfg = recommended_config("cayley", model_size_hint="large")  # lr=1e-4 (>3B models)
    assert cfg.lr == 1e-4
    assert cfg.gnn_layers == 1 and cfg.hidden_dim == 256


def test_recommended_config_families():
    assert isinstance(recommended_config("fc"), FCConfig)
    cfg = recommended_config("deepset")  # DeepSet defaults
    assert isinstance(cfg, DeepSetConfig) and cfg.lr == 1e-3


def test_recommended_config_is_the_published_configuration():
    # the published configuration reference: CayleyConfig() is the small-model default
    assert recommended_config("cayley").to_dict() == CayleyConfig().to_dict()
    assert recommended_config("cayley", "large").to_dict() == CayleyConfig(lr=1e-4).to_dict()


def test_no_defaults_file_changes_the_published_values(tmp_path, monkeypatch):
    user = tmp_path / "mine.json"
    user.write_text(json.dumps({"format_version": 1, "families": {"cayley": {"small": {"lr": 0.0123}}}}))
    monkeypatch.setenv("ILGE_SEARCH_DEFAULTS", str(user))
    assert recommended_config("cayley").lr == 1e-3
    assert recommended_config("cayley", source="regenerated").lr == 0.0123  # asked for explicitly
