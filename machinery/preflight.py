"""What is checked before anything is written or any engine starts: the command line (a flag per
Config field), every number's range and the combinations that cannot run (warnings for the legal
but surprising ones), a --resume against its run's config.json, the model folder, the rows read,
the pool, the output folder and its disk. Bad input is refused in one line (UserError).

The flags come from the dataclass, argparse rather than a library that builds flags from one
(tyro, transformers' HfArgumentParser): each needs its help in a `metadata` dict or a docstring
beside the field, where Config keeps it as the field's comment, read on one line with its paper
default; and a bad value must be one line and exit 2, which argparse's parser.error gives."""
import argparse
import inspect
import json
import operator
import os
import re
import sys
from dataclasses import asdict

from machinery import UserError
from machinery.checkpoints import latest_checkpoint
from machinery.disk import check_disk, check_writable


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
    # T divides the logits; a nucleus of 0 holds no token
    "> 0": "temperature top_p grad_clip collect_temperature collect_top_p "
           "gpu_memory_utilization",
    "<= 1": "top_p collect_top_p gpu_memory_utilization",
    # vLLM's bound
    "<= 2": "temperature collect_temperature",
    "< 1": "clip_low",
    # the dual clip bounds a negative advantage's loss where the ratio passes c > 1 + ε_high
    "> 1": "clip_c",
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


def check_config(cfg, world_size: int = 1) -> list[str]:
    """Refuse a number out of its range or a combination that cannot run (UserError, one line);
    return a warning line for each legal but surprising one. cfg: the run's config, a dataclass
    whose fields are the flags. Every rank decides alike: nothing but the command is read."""
    check_ranges(asdict(cfg), number_ranges)
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
    check_save_plan(cfg)
    warnings = []
    if cfg.mini_batch_prompts == cfg.prompts_per_step and cfg.epochs == 1:
        warnings.append(f"--mini_batch_prompts {cfg.mini_batch_prompts} is the whole step: one "
                        "update a step, on-policy (every ratio 1, the clip never acts)")
    if cfg.replay_m > cfg.n:
        warnings.append(f"--replay_m {cfg.replay_m} > --n {cfg.n}: a group holds more "
                        "replays than fresh rollouts")
    return warnings


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
    changed = [name for name, commit in commits.items() if before.get(name, commit) != commit]
    if changed and not cfg.override:
        shown = ", ".join(f"{name} at {before[name][:12]} (now {commits[name][:12]})"
                          for name in changed)
        raise UserError(f"--resume: the run in {cfg.out_dir} read {shown} on the hub: restore "
                        "that commit in huggingface_hub's cache, or add --override to continue "
                        "with the new one (config.json records the change)")
    return [{"field": name, "from": before[name], "to": commits[name], **at} for name in changed]


def check_model(path: str, flag: str = "--model_path"):
    """A model folder (a hub name is fetched into one before: resolve_model), `flag` naming it in
    a refusal: config.json and whole weights."""
    if not os.path.isdir(path):
        raise UserError(f"{flag} {path}: no such folder (a hub name like Qwen/Qwen2.5-Math-7B "
                        "is fetched once into huggingface_hub's cache)")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise UserError(f"{flag} {path}: not a model folder (no config.json)")
    check_weights(path, flag)


def check_weights(folder: str, flag: str):
    """The folder's weights are there and whole: safetensors reads each shard's header and checks
    that its tensors end where the file does (milliseconds for 7B). Without safetensors or
    pytorch_model*.bin files vLLM would load any .pt file as weights (a checkpoint's
    trainer_state.pt); a file cut short by a copy would fail deep in its loader."""
    from safetensors import SafetensorError, safe_open
    names = os.listdir(folder)
    shards = sorted(n for n in names if n.endswith(".safetensors"))
    if not shards and not any(n.startswith("pytorch_model") and n.endswith(".bin")
                              for n in names):
        raise UserError(f"{flag} {folder}: no weights (model.safetensors or pytorch_model.bin)")
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            listed = set(json.load(f).get("weight_map", {}).values())
        missing = sorted(listed - set(shards))
        if missing:
            raise UserError(f"{flag} {folder}: no {missing[0]}, a shard its "
                            "model.safetensors.index.json lists")
    for name in shards:
        path = os.path.join(folder, name)
        try:
            safe_open(path, "pt").keys()
        except SafetensorError as e:  # an interrupted copy, say
            raise UserError(f"{path}: cut short or damaged ({os.path.getsize(path):,} bytes; "
                            f"safetensors: {e})") from None


def check_tokenizer(tokenizer, path: str, flag: str = "--model_path"):
    """A tokenizer rlep.py can use: transformers builds a one-token tokenizer from a folder
    without tokenizer files, and every row is rendered with apply_chat_template."""
    if len(tokenizer) < 2:
        raise UserError(f"{flag} {path}: no tokenizer (tokenizer.json, or vocab.json and "
                        "merges.txt): copy the model's tokenizer files into it")
    if not tokenizer.chat_template:
        raise UserError(f"{flag} {path}: the tokenizer has no chat template (prompts are "
                        "rendered with apply_chat_template): copy the model's "
                        "chat_template.jinja or tokenizer_config.json into it")


def model_context(path: str, tokenizer) -> tuple[int, str] | None:
    """The model's context in tokens, and where it is said, as vLLM derives it for an ordinary
    model: config.json's max_position_embeddings, capped by the tokenizer's model_max_length,
    stretched by a linear or dynamic RoPE scaling factor. None if the config gives no length
    (vLLM then decides)."""
    from transformers import AutoConfig
    config = AutoConfig.from_pretrained(path)
    context = getattr(config, "max_position_embeddings", None)
    if not context:
        return None
    where = f"max_position_embeddings in {path}/config.json"
    if tokenizer.model_max_length < context:
        context, where = tokenizer.model_max_length, f"model_max_length of {path}'s tokenizer"
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type") in ("linear", "dynamic") and rope.get("factor"):
        context, where = int(context * rope["factor"]), f"{where}, x RoPE factor {rope['factor']}"
    return context, where


def check_context(cfg, model_path: str, tokenizer):
    """A prompt and its response must fit the model's context, as vLLM requires. cfg: its
    max_prompt_len and max_response_len."""
    found = model_context(model_path, tokenizer)
    total = cfg.max_prompt_len + cfg.max_response_len
    if found and total > found[0]:
        raise UserError(f"--max_prompt_len {cfg.max_prompt_len} + --max_response_len "
                        f"{cfg.max_response_len} = {total} tokens: over the model's context, "
                        f"{found[0]} ({found[1]})")


def check_start(cfg, model_path: str, world_size: int, inputs: tuple, prompt_text,
                commits: dict) -> tuple:
    """Rank 0's checks of what the command reads, before anything is written: the run in out_dir
    (and how this command differs from it, the hub names' commits included: `commits`, hub's),
    the model folder, its weights, tokenizer and context,
    the rows read (inputs: data.read_inputs'), the pool, where the run writes and its disk; a
    warning line for a pool the training prompts miss and for prompts longer than
    --max_prompt_len (prompt_text, as warn_cut_prompts). Raises UserError, or returns the saved
    config and the records of this command's changes for config.json."""
    from transformers import AutoTokenizer
    if os.path.exists(cfg.out_dir) and not os.path.isdir(cfg.out_dir):
        raise UserError(f"--out_dir {cfg.out_dir}: a file, not a folder")
    saved, config_path = {}, os.path.join(cfg.out_dir, "config.json")
    if os.path.isfile(config_path):
        if not cfg.resume:
            raise UserError(f"{cfg.out_dir} already holds a run: pass --resume to continue "
                            "it, or another --out_dir")
        saved = read_saved_config(config_path)
    at = {f"{part}_step": latest_checkpoint(os.path.join(cfg.out_dir, part))[0]
          for part in ("phase1", "phase2")}
    changes = resume_changes(cfg, saved, at) + commit_changes(cfg, saved, at, commits)
    check_model(model_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path)
    except OSError as e:  # a folder without a tokenizer
        raise UserError(f"--model_path {model_path}: {str(e).splitlines()[0]}") from None
    check_tokenizer(tokenizer, model_path)
    check_context(cfg, model_path, tokenizer)
    train_rows, _, pool = inputs
    # the parts whose prompts are known now (a pool still to be collected is not)
    parts = {"1": pool if cfg.phase1_prompts == "pool" else train_rows,
             "2": train_rows if cfg.phase2_prompts == "all" else pool}
    for part, rows in parts.items():
        if cfg.phase in ("all", part) and rows is not None and len(rows) < cfg.prompts_per_step:
            raise UserError(f"--prompts_per_step {cfg.prompts_per_step}: phase {part} has "
                            f"{len(rows)} prompts")
    collected = os.path.join(cfg.out_dir, "collect", "pool.jsonl")
    if cfg.phase == "2" and not cfg.pool and not os.path.isfile(collected):
        raise UserError(f"--phase 2 needs --pool FILE, or the collection's {collected}")
    if pool and cfg.phase2_prompts == "all" and cfg.phase in ("all", "2"):
        # control: phase two visits the training prompts; a pooled prompt it never visits is never
        # replayed (none visited: the baseline again, replay_frac 0)
        known = {row["id"] for row in train_rows}
        unvisited = sum(row["id"] not in known for row in pool)
        if unvisited:
            warn(f"--pool {cfg.pool}: {unvisited} of its {len(pool)} prompts are not in "
                 f"--train_file {cfg.train_file} (matched by id): with --phase2_prompts all "
                 "their answers are never replayed")
    warn_cut_prompts(inputs, tokenizer, cfg, prompt_text)
    check_writable(cfg.out_dir)
    check_disk(cfg, model_path, len(train_rows), world_size)
    return saved, changes


def warn_cut_prompts(inputs: tuple, tokenizer, cfg, prompt_text):
    """One warning line for the rows whose prompts are longer than --max_prompt_len (cut from the
    left at each step, without a word): the training rows, the validation rows, the pool
    (read_inputs). cfg: its max_prompt_len and prompt_template; prompt_text(tokenizer, row,
    template): a row's prompt. A token spans at least a byte of the text (a SentencePiece prefix
    aside): only texts of max_prompt_len bytes or more can be cut, and only they are tokenized."""
    cut = []
    for name, rows in zip(("training", "validation", "pooled"), inputs):
        texts = [prompt_text(tokenizer, row, cfg.prompt_template) for row in rows or []]
        long = [text for text in texts if len(text.encode()) >= cfg.max_prompt_len]
        ids = tokenizer(long, add_special_tokens=False)["input_ids"] if long else []
        count = sum(len(prompt) > cfg.max_prompt_len for prompt in ids)
        if count:
            cut.append(f"{count:,} of {len(rows):,} {name}")
    if cut:
        warn(f"--max_prompt_len {cfg.max_prompt_len}: {', '.join(cut)} prompts are longer, cut "
             "from the left (their start is lost)")


def read_saved_config(path: str) -> dict:
    """A run's config.json, or a refusal naming it."""
    try:
        with open(path) as f:
            saved = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not valid JSON ({e}): restore it (a checkpoint's "
                        "rlep_config.json holds the values it was saved with)") from None
    if not isinstance(saved, dict):
        raise UserError(f"{path}: not a JSON object of the run's flags")
    return saved


def warn(line: str):
    """A legal but surprising input: one line, on the rank that checks."""
    print(f"rlep.py: warning: {line}", file=sys.stderr, flush=True)


def check_save_plan(cfg):
    """A collect_step phase one never reaches would stop the run after all of phase one. Only a
    command that collects needs it: not --phase 1 or 2, nor a run given --pool."""
    collects = cfg.phase in ("all", "collect") and not cfg.pool
    if collects and not 1 <= cfg.collect_step <= cfg.phase1_steps:
        raise UserError(f"--collect_step {cfg.collect_step}: the collection needs a phase-one "
                        f"checkpoint, a step from 1 to --phase1_steps {cfg.phase1_steps}")
