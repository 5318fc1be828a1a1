"""What is checked before anything is written or any engine starts: the command line (a flag per
Config field), every number's range and the combinations that cannot run (warnings for the legal
but surprising ones), a --resume against its run's config.json, the model folder, the rows read,
the pool, the output folder and its disk. Bad input is refused in one line (UserError).

The flags come from the dataclass, argparse rather than a library that builds flags from one
(tyro, transformers' HfArgumentParser): each needs its help in a `metadata` dict or a docstring
beside the field, where Config keeps it as the field's comment, read on one line with its paper
default; and a bad value must be one line and exit 2, which argparse's parser.error gives."""
import argparse
import glob
import hashlib
import inspect
import json
import math
import operator
import os
import re
import string
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch

from machinery import UserError
from machinery.checkpoints import checkpoint_path, check_resume, damage, latest_checkpoint
from machinery.data import load_pool
from machinery.disk import check_disk, collects, meta_model, trained_parts
from machinery.files import read_jsonl


def dataclass_flags(cls):
    """(name, argparse settings) of each field of the dataclass `cls`, from its line in the
    class's source, the one place a field is described: the help is its comment, a leading "{a,
    b}: " the values it takes (a field without a comment gets no flag)."""
    source = inspect.getsource(cls)
    for name, comment in re.findall(r"^ +(\w+): \w+ = .*?  # (.*)$", source, re.M):
        kind = cls.__annotations__[name]
        flag = {"action": argparse.BooleanOptionalAction} if kind is bool else {"type": kind}
        values, text = re.fullmatch(r"(?:\{([^}]*)\}: )?(.*)", comment).groups()
        flag["help"] = text.replace("%", "%%")  # argparse formats help with %
        if values:
            flag["choices"] = values.split(", ")
        yield name, flag


# vLLM refuses a request for more samples than this (its VLLM_MAX_N_SEQUENCES)
max_samples = int(os.environ.get("VLLM_MAX_N_SEQUENCES", 16384))

# Each number's range (the config's fields, by name); a field may have two bounds
number_ranges = {
    # GRPO standardises a group's rewards: a group of one has no spread, its Â is 0
    ">= 2": "n",
    ">= 1": "prompts_per_step max_prompt_len max_response_len mini_batch_prompts epochs "
            "micro_batch_size phase1_steps phase2_steps collect_k min_successes val_k "
            "save_every timeout_minutes max_gen_rounds",
    ">= 0": "overlong_buffer overlong_factor lr weight_decay warmup_steps clip_low clip_high "
            "micro_batch_tokens replay_m replay_coef val_every seed keep_checkpoints "
            "log_samples train_prompts collect_chunk",
    # a nucleus of 0 holds no token
    "> 0": "top_p grad_clip collect_top_p gpu_memory_utilization",
    # T divides the logits: vLLM raises a T below 0.01 to 0.01 (sampling_params' _MAX_TEMP) while
    # the trainer would divide by the T given
    ">= 0.01": "temperature collect_temperature",
    "<= 1": "top_p collect_top_p gpu_memory_utilization",
    # vLLM's bound
    "<= 2": "temperature collect_temperature",
    "< 1": "clip_low",
    # the dual clip bounds a negative advantage's loss where the ratio passes c > 1 + ε_high
    "> 1": "clip_c",
    # vLLM's most samples a request
    f"<= {max_samples}": "n collect_k val_k",
    # numpy's and vLLM's seeds (before config.json, which would then refuse the corrected command)
    "<= 2147483647": "seed",
    # the save plan holds a step each: more would exhaust the memory before the first step
    "<= 1000000": "phase1_steps phase2_steps",
}


comparisons = {">=": (operator.ge, "at least"), ">": (operator.gt, "above"),
               "<=": (operator.le, "at most"), "<": (operator.lt, "below")}


# a flag at most another: a mini-batch is part of a step, a pooled prompt needs at most K answers,
# the overlong window lies inside L_max
at_most = {"mini_batch_prompts": "prompts_per_step", "min_successes": "collect_k",
           "overlong_buffer": "max_response_len"}


def check_ranges(values: dict, ranges: dict):
    """Refuse a flag's value out of its range: ranges {"<sign> <limit>": "name name ..."}, as
    number_ranges (eval.py has its own); values {name: value}."""
    for bound, names in ranges.items():
        sign, limit = bound.split()
        compare, words = comparisons[sign]
        for name in names.split():
            # NaN fails every comparison
            if not compare(values[name], float(limit)):
                raise UserError(f"--{name} {values[name]}: must be {words} {limit}")
    # infinity passes a lower bound
    for name in " ".join(ranges.values()).split():
        if not math.isfinite(values[name]):
            raise UserError(f"--{name} {values[name]}: must be a finite number")


def check_config(cfg, world_size: int = 1) -> list[str]:
    """Refuse a number out of its range, a template, a folder or a combination that cannot run
    (UserError, one line); return a warning line for each legal but surprising one. cfg: the
    run's config, a dataclass whose fields are the flags. Every rank decides alike: nothing but
    the command is read, and the cache folder (where a built-in model is made first)."""
    check_cuda(cfg.preset)
    check_ranges(asdict(cfg), number_ranges)
    check_template(cfg.prompt_template)
    # before a built-in model is made there (--out_dir's is rank 0's, in check_start)
    check_folder(cfg.cache_dir, "--cache_dir")
    for name, other in at_most.items():
        if getattr(cfg, name) > getattr(cfg, other):
            raise UserError(f"--{name} {getattr(cfg, name)}: must be at most --{other} "
                            f"{getattr(cfg, other)}")
    if cfg.prompts_per_step % world_size:
        raise UserError(f"--prompts_per_step {cfg.prompts_per_step}: must be a multiple of "
                        f"the {world_size} ranks")
    if cfg.phase1_prompts == "pool" and not cfg.pool and cfg.phase in ("all", "1"):
        raise UserError("--phase1_prompts pool needs --pool FILE (the prompt set to train "
                        "the baseline on)")
    if cfg.phase == "collect" and cfg.pool:
        # a run given a pool collects none: the command would end having done nothing
        raise UserError(f"--phase collect --pool {cfg.pool}: a given pool is not collected; "
                        "leave out --pool to collect one, or run --phase 2 on it")
    check_save_plan(cfg)
    warnings = []
    if cfg.mini_batch_prompts == cfg.prompts_per_step and cfg.epochs == 1:
        warnings.append(f"--mini_batch_prompts {cfg.mini_batch_prompts} is the whole step: one "
                        "update a step, on-policy (every ratio 1, the clip never acts)")
    if cfg.replay_m > cfg.n:
        warnings.append(f"--replay_m {cfg.replay_m} > --n {cfg.n}: a group holds more "
                        "replays than fresh rollouts")
    return warnings


def check_cuda(preset: str):
    """A GPU preset where CUDA does not work (no GPU, a driver older than torch's CUDA, a CPU
    build of torch) is refused: the ranks would fall back to the CPU in silence."""
    if preset not in ("gpu", "node", "paper") or torch.cuda.is_available():
        return
    cuda, torch_version = torch.version.cuda, f"--preset {preset}: torch {torch.__version__}"
    if not cuda:
        raise UserError(f"{torch_version} is built without CUDA: pip install -r requirements.txt")
    # CUDA 13's wheels need driver 580 (NVIDIA's CUDA toolkit release notes)
    driver = "NVIDIA driver 580 or later" if cuda.startswith("13.") else \
        f"a driver that supports CUDA {cuda}"
    raise UserError(f"{torch_version} is built for CUDA {cuda} and finds no working GPU: CUDA "
                    f"{cuda} needs {driver} (nvidia-smi shows the driver)")


def check_template(template: str, flag: str = "--prompt_template"):
    """A plain row's prompt is the template with {problem} filled in: a template that names
    another field would fail at its first row, one that does not name {problem} would give every
    row the same prompt."""
    try:
        fields = {name for _, name, _, _ in string.Formatter().parse(template)
                  if name is not None}
    except ValueError as e:  # an unbalanced brace
        raise UserError(f"{flag} {template!r}: {e} (a literal brace is written {{{{ or }}}})")
    if fields != {"problem"}:
        named = ", ".join("{" + name + "}" for name in sorted(fields)) or "no field"
        raise UserError(f"{flag} {template!r}: names {named}; a template names {{problem}}, "
                        "the row's problem, and nothing else (a literal brace is {{ or }})")


# The fields a resumed run may change, as none changes what the run computes: where files (and W&B's
# curves) go, what is shown, kept or waited for; memory and speed (the same sums in other pieces,
# other float rounding: a run resumed on other hardware may need other values); phase, which chooses
# the parts to run, not what a part computes; preset, whose values are compared field by field.
# dtype "auto" takes the run's measured dtype.
free_on_resume = {"out_dir", "phase", "resume", "override", "keep_checkpoints", "log_samples",
                  "progress", "timeout_minutes", "cache_dir", "preset", "micro_batch_size",
                  "micro_batch_tokens", "share_prompts", "gradient_checkpointing", "collect_chunk",
                  "gpu_memory_utilization", "wandb_project"}


def resume_changes(cfg, saved: dict, at: dict) -> list[dict]:
    """The fields where a --resume command differs from its run's config.json (`saved`), or that
    config.json lacks: refused, or with --override returned as records for config.json's
    "overrides" (a lacking field's "from" None), each with `at` (the steps of the run's newest
    checkpoints)."""
    now = asdict(cfg)
    compared = [name for name in now if name not in free_on_resume]
    # A field config.json lacks (deleted by hand, or the run is an older rlep.py's) is refused, not
    # filled in: the command's value could silently differ from the run's. A checkpoint's
    # rlep_config.json is no stand-in: it predates any later --override.
    lacking = [name for name in compared if saved and name not in saved]
    if lacking and not cfg.override:
        shown = ", ".join(f"--{name}" for name in lacking)
        raise UserError(f"--resume: {os.path.join(cfg.out_dir, 'config.json')} lacks {shown}: "
                        "restore them (a checkpoint's rlep_config.json holds the values it was "
                        "saved with), or add --override to take this command's (config.json "
                        "records them)")
    changed = [name for name in compared if name in saved and saved[name] != now[name]
               and not (name == "dtype" and now[name] == "auto")]
    if changed and not cfg.override:
        shown = ", ".join(f"--{name} {saved[name]!r} (now {now[name]!r})" for name in changed)
        raise UserError(f"--resume: the run in {cfg.out_dir} has {shown}: resume with its "
                        "values, or add --override to continue with these (config.json "
                        "records the change)")
    return [{"field": name, "from": saved.get(name), "to": now[name], **at}
            for name in compared if name in changed or name in lacking]


def commit_changes(cfg, saved: dict, at: dict, commits: dict) -> list[dict]:
    """A --resume whose hub name now resolves to another commit than its run's config.json
    records (a model or data file updated on the hub) is refused, as a changed flag is; with
    --override, the records of the new commits for config.json's "overrides"."""
    before = saved.get("hub_commits", {})
    # a name config.json lacks (an older run's) is no change
    changed = [name for name, commit in commits.items() if before.get(name, commit) != commit]
    if changed and not cfg.override:
        shown = ", ".join(f"{name} at {before[name][:12]} (now {commits[name][:12]})"
                          for name in changed)
        raise UserError(f"--resume: the run in {cfg.out_dir} read {shown} on the hub: restore "
                        "that commit in huggingface_hub's cache, or add --override to continue "
                        "with the new one (config.json records the change)")
    return [{"field": name, "from": before[name], "to": commits[name], **at} for name in changed]


def data_changes(cfg, saved: dict, at: dict, digests: dict) -> list[dict]:
    """A --resume whose data file's rows are not those its run read (the answers edited between a
    stop and its resume) is refused, as a changed flag is; with --override, the records of the
    new digests for config.json's "overrides"."""
    before = saved.get("data_digests", {})
    # a file config.json lacks (one the run did not read) is no change
    changed = [flag for flag, digest in digests.items() if before.get(flag, digest) != digest]
    if changed and not cfg.override:
        flag = changed[0]
        raise UserError(f"--resume: --{flag} {getattr(cfg, flag)}: its rows are not those the "
                        f"run in {cfg.out_dir} read (their SHA-256 differs from config.json's): "
                        "restore the file, or add --override to continue on these rows "
                        "(config.json records the change)")
    return [{"field": f"{flag} rows", "from": before[flag], "to": digests[flag], **at}
            for flag in changed]


def data_digests(inputs: tuple) -> dict:
    """{flag: the SHA-256 of its rows as read} of the data files this command read (inputs:
    data.read_inputs'), for config.json's "data_digests": a local file has no hub commit."""
    return {flag: hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()
            for flag, rows in zip(("train_file", "val_file", "pool"), inputs) if rows}


def check_model(path: str, flag: str, end_token) -> tuple:
    """A model folder the trainer and vLLM both load (a hub name is fetched into one before), `flag`
    naming it in a refusal: a config.json transformers knows, whole weights of the config's
    shapes, a tokenizer whose chat template renders, a token that ends a response
    (end_token(tokenizer), None if there is none), the tokenizer's ids inside the vocabulary.
    Returns (tokenizer, config)."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig, AutoTokenizer
    if not os.path.isdir(path):
        raise UserError(f"{flag} {path}: no such folder (a hub name like Qwen/Qwen2.5-Math-7B "
                        "is fetched once into huggingface_hub's cache)")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise UserError(f"{flag} {path}: not a model folder (no config.json)")
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError) as e:  # an unknown model_type, a file not JSON
        raise UserError(f"{flag} {path}: its config.json: {first_line(e)}") from None
    except StrictDataclassError as e:  # a value of another type, layer_types' count
        raise UserError(f"{flag} {path}: its config.json: "
                        f"{' '.join(str(e).split())}") from None
    check_architecture(config, path, flag)
    check_weights(path, flag, config)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, KeyError) as e:  # a folder without a tokenizer, say
        raise UserError(f"{flag} {path}: {first_line(e)}") from None
    # transformers builds a one-token tokenizer from a folder without tokenizer files, and every
    # row is rendered with apply_chat_template, whose template must render
    if len(tokenizer) < 2:
        raise UserError(f"{flag} {path}: no tokenizer (tokenizer.json, or vocab.json and "
                        "merges.txt): copy the model's tokenizer files into it")
    if not tokenizer.chat_template:
        raise UserError(f"{flag} {path}: the tokenizer has no chat template (prompts are "
                        "rendered with apply_chat_template): copy the model's "
                        "chat_template.jinja or tokenizer_config.json into it")
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "1 + 1?"}],
                                             add_generation_prompt=True, tokenize=False)
    except Exception as e:  # jinja's TemplateError, or the template's own raise
        raise UserError(f"{flag} {path}: its chat template does not render "
                        f"({first_line(e)})") from None
    if "1 + 1?" not in text:  # every prompt would be the same (vLLM refuses an empty one)
        raise UserError(f"{flag} {path}: its chat template leaves the user's message out of the "
                        f"prompt (it renders {text[:40]!r})")
    end = end_token(tokenizer)
    if end is None:
        raise UserError(f"{flag} {path}: the tokenizer has no EOS token to end a response: "
                        "give --stop_token")
    vocab = config.get_text_config().vocab_size
    ids = {"its tokenizer's largest id": len(tokenizer) - 1, "the end token's id": end,
           "the pad token's id": tokenizer.pad_token_id}
    for what, i in ids.items():
        if i is not None and i >= vocab:
            raise UserError(f"{flag} {path}: {what}, {i}, is outside its vocabulary of {vocab} "
                            "(vocab_size in config.json): a tokenizer of another model?")
    return tokenizer, config


def check_architecture(config, path: str, flag: str):
    """vLLM builds the class config.json's `architectures` names, the trainer its model_type's: a
    class of another model type (Llama over Qwen2's weights) loads without a word in vLLM, less
    what it lacks (Qwen2's attention biases), and samples from another model than it trains.
    A class transformers does not know (remote code) is not judged."""
    from transformers.models.auto import modeling_auto
    mappings = [getattr(modeling_auto, name) for name in dir(modeling_auto)
                if name.endswith("_MAPPING_NAMES")]
    for architecture in config.architectures or []:
        types = {kind for mapping in mappings for kind, names in mapping.items()
                 if architecture in ((names,) if isinstance(names, str) else names)}
        if types and config.model_type not in types:
            raise UserError(f"{flag} {path}: its config.json's architectures names "
                            f"{architecture}, a {sorted(types)[0]} model, over model_type "
                            f"{config.model_type}: vLLM would build {architecture} on these "
                            "weights; a config of another model?")


def first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def check_weights(folder: str, flag: str, config):
    """The folder's weights are there, whole and of the config's shapes: safetensors reads each
    shard's header and checks that its tensors end where the file does, and each tensor's shape
    is compared to the model config.json builds on the meta device (disk.meta_model).
    Without safetensors or pytorch_model*.bin files vLLM would load any .pt file as weights (a
    checkpoint's trainer_state.pt); a file cut short by a copy would fail deep in its loader."""
    from safetensors import SafetensorError, safe_open
    shards = sorted(glob.glob("*.safetensors", root_dir=folder))
    if not shards and not glob.glob("pytorch_model*.bin", root_dir=folder):
        raise UserError(f"{flag} {folder}: no weights (model.safetensors or pytorch_model.bin)")
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        try:
            with open(index) as f:
                listed = set(json.load(f)["weight_map"].values())
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise UserError(f"{index}: not a safetensors index ({first_line(e)})") from None
        missing = sorted(listed - set(shards))
        if missing:
            raise UserError(f"{flag} {folder}: no {missing[0]}, a shard its "
                            "model.safetensors.index.json lists")
    shapes = {}
    for name in shards:
        path = os.path.join(folder, name)
        try:
            with safe_open(path, "pt") as f:
                shapes.update({key: f.get_slice(key).get_shape() for key in f.keys()})
        except SafetensorError as e:  # an interrupted copy, say
            raise UserError(f"{path}: cut short or damaged ({os.path.getsize(path):,} bytes; "
                            f"safetensors: {e})") from None
    if not shapes:  # pytorch_model*.bin alone (vLLM loads them): their shapes are not read
        return
    expected = meta_model(folder).state_dict()
    shared = [key for key in shapes if key in expected]
    if not shared:
        raise UserError(f"{flag} {folder}: none of its weights' names is one of the "
                        f"{config.model_type} model config.json describes")
    # the layers on both sides: vLLM refuses a weight the model lacks, after the run's start
    for names, others, why in ((expected, shapes, "has no such weight"),
                               (shapes, expected, "does not describe it")):
        for key in names:
            if key not in others and re.search(r"\.layers\.\d+\.(?!.*inv_freq$)", key):
                raise UserError(f"{flag} {folder}: {key}: its config.json {why} "
                                f"(num_hidden_layers {config.get_text_config().num_hidden_layers}"
                                ": a config of another model?)")
    for key in shared:
        if shapes[key] != list(expected[key].shape):  # get_shape gives a list
            raise UserError(f"{flag} {folder}: {key} is {shapes[key]} in the weights, "
                            f"{list(expected[key].shape)} by its config.json (hidden_size, "
                            "vocab_size, the layers' sizes: a config of another model?)")


# RoPE types whose factor vLLM does not apply again to the context (theirs is already scaled)
rope_scaled_already = {"su", "longrope", "llama3", "yarn", "deepseek_yarn",
                       "deepseek_llama_scaling"}


def model_context(config) -> tuple[int, str]:
    """The model's context in tokens, and where it is said, as vLLM 0.32 derives it
    (vllm/config/model.py, _get_and_verify_max_len) for the models rlep.py names (Qwen2,
    Qwen2.5(-Math), SmolLM2 and Llama, builtin.py's tiny Qwen2): max_position_embeddings (2,048,
    vLLM's default, where there is none) times the RoPE scaling factor unless its type is scaled
    already; the tokenizer is not read. vLLM's own rule covers more, which these models' configs
    do not give: eight other length keys (the smallest wins, model_max_length over all), RoPE
    parameters per kind of layer, Gemma 3 (whose factor it leaves out); a model that gives those
    may get another context from vLLM than this one."""
    config = config.get_text_config()
    context, where = 2048, "vLLM's default"
    if getattr(config, "max_position_embeddings", None):
        context, where = config.max_position_embeddings, "max_position_embeddings in config.json"
    rope = getattr(config, "rope_parameters", None) or {}
    factor = rope.get("factor") or 1.0
    if factor != 1.0 and rope.get("rope_type") not in rope_scaled_already:
        context, where = int(context * factor), f"{where}, x RoPE factor {factor}"
    return context, where


def check_context(cfg, config):
    """A prompt and its response must fit the model's context, as vLLM requires. cfg: its
    max_prompt_len and max_response_len."""
    context, where = model_context(config)
    total = cfg.max_prompt_len + cfg.max_response_len
    if total > context:
        raise UserError(f"--max_prompt_len {cfg.max_prompt_len} + --max_response_len "
                        f"{cfg.max_response_len} = {total} tokens: over the model's context, "
                        f"{context} ({where})")


def check_folder(path: str, flag: str):
    """A folder the run writes in: a name given, one already there, or one that can be made (no
    file, and no link to nothing on the way), and writable: a folder made and removed in the
    nearest one that exists, where the run will write, so that a read-only disk, a folder of
    another user's or a virtual filesystem (/proc) is refused here, not by the first save. The
    folder's own contents stay as they are."""
    if not path.strip():
        raise UserError(f"{flag} {path!r}: a folder is needed")
    where = os.path.abspath(path)
    while not os.path.isdir(where):
        if os.path.islink(where) and not os.path.exists(where):
            raise UserError(f"{flag} {path}: {where} is a link to nothing (or a loop of links)")
        if os.path.exists(where):
            inside = "" if where == os.path.abspath(path) else f" {where} is"
            raise UserError(f"{flag} {path}:{inside} a file, not a folder")
        where = os.path.dirname(where)
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".rlep-write-test-", dir=where))
    except OSError as e:
        raise UserError(f"{flag} {path}: cannot write in {where} ({e.strerror})") from None


def is_run(folder: str) -> bool:
    """Whether a folder holds a run: a config.json of rlep.py's (a model's has no phase1_steps)."""
    try:
        with open(os.path.join(folder, "config.json")) as f:
            return "phase1_steps" in json.load(f)
    except (OSError, ValueError, TypeError):
        return False


def check_one_run(out_dir: str):
    """A run folder holds one run: none around it, none inside it (a run's pruning and its
    leftovers' removal would delete the other without a word); and a folder with a run's parts
    but no config.json, which says what values made them, is not run again."""
    here = os.path.abspath(out_dir)
    for above in Path(here).parents:
        if is_run(above):
            raise UserError(f"--out_dir {out_dir}: inside the run in {above}: choose a folder "
                            "outside it (its pruning would delete this one)")
    for root, _, names in os.walk(here):
        if root != here and "config.json" in names and is_run(root):
            raise UserError(f"--out_dir {out_dir}: holds the run in {root}: a run's folder holds "
                            "one run; move it out, or choose another --out_dir")
    parts = [p for p in ("phase1", "collect", "phase2") if os.path.exists(os.path.join(here, p))]
    # the parts are folders, the lock a file (only the parts there are listed; a lock not
    # there is no folder)
    for name in parts + ["rlep.lock"]:
        if os.path.isdir(os.path.join(here, name)) == (name == "rlep.lock"):
            kind = "a folder" if name == "rlep.lock" else "a file"
            raise UserError(f"--out_dir {out_dir}: its {name} is {kind}, which the run writes "
                            "as the other: move it away")
    if parts and not os.path.isfile(os.path.join(here, "config.json")):
        raise UserError(f"--out_dir {out_dir}: holds a run's {parts[0]}/ but no config.json, "
                        "which says what values made it: restore it (a checkpoint's "
                        "rlep_config.json holds them), or choose another --out_dir")


def check_run_rows(out_dir: str):
    """The rows of the run's own JSONL files that a resume reads hold the keys it reads: each
    part's metrics and samples their step (the rows past the checkpoint go), the collection's
    progress its prompts' ids and answers."""
    step = {"step": int}
    needed = {"phase1/metrics.jsonl": step, "phase1/samples.jsonl": step,
              "phase2/metrics.jsonl": step, "phase2/samples.jsonl": step,
              "collect/progress.jsonl": {"id": str, "successes": list}}
    for name, keys in needed.items():
        path = os.path.join(out_dir, name)
        for i, row in enumerate(read_jsonl(path), start=1):
            for key, kind in keys.items():
                value = row.get(key) if isinstance(row, dict) else None
                if type(value) is not kind:  # JSON's own types: true is no int
                    raise UserError(f"{path}: row {i}: no {key!r} ({kind.__name__}), which "
                                    "rlep.py writes: restore the row, or remove it")


def check_checkpoints(cfg):
    """The checkpoints this command reads are whole (checkpoints.damage): each part's newest,
    which a resume continues, and phase one's at collect_step, which the collection reads."""
    for part in trained_parts[cfg.phase]:
        check_resume(os.path.join(cfg.out_dir, part))
    if not collects(cfg) or os.path.isfile(os.path.join(cfg.out_dir, "collect", "pool.jsonl")):
        return
    phase1 = os.path.join(cfg.out_dir, "phase1")
    ckpt = checkpoint_path(phase1, cfg.collect_step)
    # phase one still to reach collect_step makes it; a collection begun has it already
    if cfg.phase == "all" and latest_checkpoint(phase1)[0] < cfg.collect_step:
        return
    if not os.path.isdir(ckpt):
        raise UserError(f"{ckpt}: phase one has no checkpoint at --collect_step "
                        f"{cfg.collect_step} for the collection to read (run phase one first)")
    if what := damage(ckpt, weights_only=True):
        raise UserError(f"{ckpt}: damaged, {what}: the collection reads its weights")


def check_wandb(project: str):
    """W&B can start: offline it always can; online, its key must log in (a network call)."""
    import wandb
    if os.environ.get("WANDB_MODE") in ("offline", "disabled", "dryrun"):
        return
    try:
        wandb.login(verify=True, timeout=30)
    except Exception as e:  # no key, a key refused, no network
        raise UserError(f"--wandb_project {project}: W&B cannot start ({first_line(e)}; "
                        "WANDB_MODE=offline keeps the curves on this machine)") from None


def check_start(cfg, model_path: str, world_size: int, inputs: tuple, commits: dict,
                prompt_text, end_token) -> tuple:
    """Rank 0's preflight of everything the command reads, before anything is written, so that
    nothing after it can fail on the user's input: the output and cache folders, the run in
    out_dir (how this command differs from it, the hub names' commits included: `commits`,
    hub's) and its checkpoints, the model folder (end_token: rlep.end_token_id) and its context,
    the rows read (inputs: data.read_inputs'; their digests against the run's), each file's
    first prompt rendered (prompt_text: rlep's), the pool against the training rows, the disk,
    W&B. A warning line each for a pool the training prompts miss and for prompts longer than
    --max_prompt_len. Raises UserError, or returns the saved config, the records of this
    command's changes for config.json, the disk's line (printed once the run starts) and the
    data's digests (data_digests)."""
    check_folder(cfg.out_dir, "--out_dir")
    check_one_run(cfg.out_dir)
    # a run there (its config.json) exactly when --resume is given
    config_path = os.path.join(cfg.out_dir, "config.json")
    if os.path.isfile(config_path) != cfg.resume:
        raise UserError(f"--resume: {cfg.out_dir} holds no run (no config.json): check its name, "
                        "or leave out --resume to start one there" if cfg.resume else
                        f"{cfg.out_dir} already holds a run: pass --resume to continue it, or "
                        "another --out_dir")
    saved = read_saved_config(cfg, config_path) if cfg.resume else {}
    at = {f"{part}_step": latest_checkpoint(os.path.join(cfg.out_dir, part))[0]
          for part in ("phase1", "phase2")}
    digests = data_digests(inputs)
    changes = (resume_changes(cfg, saved, at) + commit_changes(cfg, saved, at, commits)
               + data_changes(cfg, saved, at, digests))
    check_checkpoints(cfg)
    check_run_rows(cfg.out_dir)
    tokenizer, config = check_model(model_path, "--model_path",
                                    lambda t: end_token(t, cfg.stop_token))
    check_context(cfg, config)
    check_rows(cfg, inputs, tokenizer, prompt_text)
    warn_cut_prompts(dict(zip(("training", "validation", "pooled"), inputs)), tokenizer,
                     cfg.max_prompt_len, cfg.prompt_template, prompt_text)
    disk_line = check_disk(cfg, model_path, len(inputs[0]), world_size)
    if cfg.wandb_project:
        check_wandb(cfg.wandb_project)
    return saved, changes, disk_line, digests


def check_rows(cfg, inputs: tuple, tokenizer, prompt_text):
    """The rows against the run: enough prompts a step for each part, a pool for phase two, the
    pool's ids against the training rows' problems, the first prompt of each file rendered."""
    train_rows, val_rows, pool = inputs
    # the parts whose prompts are known now (a pool still to be collected is not)
    parts = {"1": pool if cfg.phase1_prompts == "pool" else train_rows,
             "2": train_rows if cfg.phase2_prompts == "all" else pool}
    for part, rows in parts.items():
        if cfg.phase in ("all", part) and rows is not None and len(rows) < cfg.prompts_per_step:
            raise UserError(f"--prompts_per_step {cfg.prompts_per_step}: phase {part} has "
                            f"{len(rows)} prompts")
    collected = os.path.join(cfg.out_dir, "collect", "pool.jsonl")
    if cfg.phase in ("all", "2") and not cfg.pool:
        if os.path.isfile(collected):
            load_pool(collected)  # phase two reads it: a file edited by hand is refused now
        elif cfg.phase == "2":
            raise UserError(f"--phase 2 needs --pool FILE, or the collection's {collected}")
    check_prompts({"--train_file": train_rows, "--val_file": val_rows, "--pool": pool},
                  tokenizer, cfg.prompt_template, prompt_text)
    problems = {row["id"]: row["problem"] for row in train_rows}
    for row in pool or []:
        if problems.get(row["id"], row["problem"]) != row["problem"]:
            raise UserError(f"--pool {cfg.pool}: id {row['id']!r} is another problem in "
                            f"--train_file {cfg.train_file} ({row['problem'][:30]!r} in the "
                            f"pool, {problems[row['id']][:30]!r} there): a pool's answers go to "
                            "the training prompt of their id")
    if pool and cfg.phase2_prompts == "all" and cfg.phase in ("all", "2"):
        # control: phase two visits the training prompts; a pooled prompt it never visits is never
        # replayed (none visited: the baseline again, replay_frac 0)
        unvisited = sum(row["id"] not in problems for row in pool)
        if unvisited:
            warn(f"--pool {cfg.pool}: {unvisited} of its {len(pool)} prompts are not in "
                 f"--train_file {cfg.train_file} (matched by id): with --phase2_prompts all "
                 "their answers are never replayed")


def check_prompts(named_rows: dict, tokenizer, template: str, prompt_text):
    """Each file's first prompt renders: the template (a format spec, say) and the chat template
    on a real row. named_rows {the file's flag: its rows}; prompt_text: rlep's."""
    for flag, rows in named_rows.items():
        try:
            prompt_text(tokenizer, rows[0], template) if rows else None
        except Exception as e:  # a template's format spec, a chat template that raises
            raise UserError(f"{flag}: its first row's prompt does not render "
                            f"({type(e).__name__}: {first_line(e)})") from None


def warn_cut_prompts(named_rows: dict, tokenizer, max_len: int, template: str, prompt_text,
                     script: str = "rlep.py"):
    """One warning line for the rows whose prompts are longer than --max_prompt_len (cut from the
    left, without a word), named_rows {what they are: rows} (the training rows, the validation
    rows, the pool; eval.py's benchmarks); prompt_text(tokenizer, row, template): a row's prompt.
    A token spans at least a byte of the text (a SentencePiece prefix aside): only texts of
    max_len bytes or more can be cut, and only they are tokenized."""
    cut = []
    for name, rows in named_rows.items():
        texts = [prompt_text(tokenizer, row, template) for row in rows or []]
        long = [text for text in texts if len(text.encode()) >= max_len]
        ids = tokenizer(long, add_special_tokens=False)["input_ids"] if long else []
        count = sum(len(prompt) > max_len for prompt in ids)
        if count:
            cut.append(f"{count:,} of {len(rows):,} {name}")
    if cut:
        warn(f"--max_prompt_len {max_len}: {', '.join(cut)} prompts are longer, cut from the "
             "left (their start is lost)", script)


def read_saved_config(cfg, path: str) -> dict:
    """A run's config.json, or a refusal naming it: its values (edited by hand, say) pass the
    checks its flags pass: each a value of the flag's type and among its choices ("dtype":
    "float16", which a resume with --dtype auto would take, is refused as --dtype float16 is),
    each number in its range. cfg: the command's Config, whose class gives the flags."""
    try:
        with open(path) as f:
            saved = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not valid JSON ({e}): restore it (a checkpoint's "
                        "rlep_config.json holds the values it was saved with)") from None
    if not isinstance(saved, dict):
        raise UserError(f"{path}: not a JSON object of the run's flags")
    for name, flag in dataclass_flags(type(cfg)):
        if name not in saved:
            continue
        # a flag's type, as argparse takes it (a bool's flag has none): JSON's own types (true
        # is no int), a float's flag also taking a whole number
        value, kind = saved[name], flag.get("type", bool)
        typed = type(value) in ((int, float) if kind is float else (kind,))
        if not typed or value not in flag.get("choices", [value]):
            must = ", ".join(flag["choices"]) if "choices" in flag else f"a {kind.__name__}"
            raise UserError(f'{path}: "{name}" is {value!r}; it must be {must}, as --{name}\'s '
                            "value: restore it (a checkpoint's rlep_config.json holds it)")
    for key, kind in (("overrides", list), ("hub_commits", dict), ("data_digests", dict)):
        if not isinstance(saved.get(key, kind()), kind):
            raise UserError(f'{path}: "{key}" must be a {kind.__name__} (rlep.py writes it): '
                            "restore it")
    try:
        # check_ranges reads only its flags' names: config.json's other keys (overrides,
        # hub_commits) are not among them
        check_ranges({**asdict(cfg), **saved}, number_ranges)
    except UserError as e:
        raise UserError(f"{path}: holds {e}: restore it (a checkpoint's rlep_config.json "
                        "holds it)") from None
    return saved


def warn(line: str, script: str = "rlep.py"):
    """A legal but surprising input: one line, on the rank that checks."""
    print(f"{script}: warning: {line}", file=sys.stderr, flush=True)


def check_save_plan(cfg):
    """A collect_step phase one never reaches would stop the run after all of phase one. Only a
    command that collects needs it."""
    if collects(cfg) and not 1 <= cfg.collect_step <= cfg.phase1_steps:
        raise UserError(f"--collect_step {cfg.collect_step}: the collection needs a phase-one "
                        f"checkpoint, a step from 1 to --phase1_steps {cfg.phase1_steps}")
