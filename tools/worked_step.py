"""One RLEP training step worked through for a teacher, from a real run: docs/worked-step.md.

    OMP_NUM_THREADS=1 python tools/worked_step.py          # ~20 s here: writes the page
    OMP_NUM_THREADS=1 python tools/worked_step.py --print  # the page on stdout, nothing written

It runs the tiny preset as `python rlep.py --preset tiny` does (phase one, the collection from
its step-4 checkpoint, phase two from the base model), in this process, and records what rlep's
own functions compute during one phase-two step: each is wrapped by a recorder that keeps the
call's arguments and result and returns the real result, so the run is unchanged. The page shows
those numbers, each named by the function that computed it. Two are not returned by any
function: the group's mean and std, which group_advantages divides by; they are taken here with
the same torch calls. A single token's ratio, clip decision and loss come from rlep.policy_loss
called on that token alone.

Validation is off (--val_every 0: it draws its own seeds and changes no training number) and
phase two stops after the shown step (--phase2_steps 2): the numbers are those of the same step
of `python rlep.py --preset tiny`, whose phase2/metrics.jsonl row holds the same clip_frac,
ratio_mean, ratio_max and grad_norm as the page's summary.

tests/test_worked_step.py runs the step again and fails if the page's numbers differ from the
run's, or if the run's numbers break the rules written out there by hand.
"""
import argparse
import collections
import contextlib
import inspect
import json
import math
import os
import re
import sys
import tempfile
from unittest import mock

# 2 shared cores: more threads only spin (docs/cpu.md); before torch starts its pool
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402

repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, repo)
from machinery import data, fsdp, hub, planner, ranks
import rlep  # noqa: E402

page_path = os.path.join(repo, "docs", "worked-step.md")
command = "OMP_NUM_THREADS=1 python tools/worked_step.py"
preset_flags = ["--preset", "tiny", "--val_every", "0", "--phase2_steps", "2"]
# phase two's step, numbered as metrics.jsonl numbers it: its prompt 6-2 is a rescue that lands
# in the off-policy mini-batch (step 1's rescue, 5-1, is in the on-policy one)
shown_step = 2
# The rlep.py functions the page quotes, by the role they play: a rename in rlep.py is one
# change here (the recorders and the page's labels read this).
rlep_names = {
    "groups": "make_groups", "group": "build_group", "penalty": "overlong_penalty",
    "advantages": "group_advantages", "replays": "draw_replays",
    "plan": "plan_mini_batches",
    "mini_batch": "planner.micro_batches", "collate": "collate",
    "old_logprobs": "keep_old_logprobs", "loss": "policy_loss", "update": "ppo_update",
    "logprobs": "TokenLogProbs",
    "collect": "collect", "visit": "visit",
}
recorded_roles = ["group", "penalty", "advantages", "replays", "mini_batch", "collate",
                  "old_logprobs", "loss", "update"]


def fn(role: str) -> str:
    """A function's name as the page prints it."""
    return f"`{rlep_names[role]}`"


def home(role: str) -> tuple:
    """(module, attribute) of a role's function: rlep's, or a machinery module's where named
    so."""
    module, _, name = rlep_names[role].rpartition(".")
    return {"planner": planner, "fsdp": fsdp}.get(module, rlep), name


class Recording:
    """While open, rlep's functions of `recorded_roles` are wrapped: each call made during
    phase two's step `step` is kept as (its arguments by name, its result). make_groups, which
    starts every step, tells the recorders which step it is."""

    def __init__(self, step: int):
        self.step = step
        self.current_step = None
        self.calls = collections.defaultdict(list)  # role -> [(arguments, result)]
        self.real = {role: getattr(*home(role)) for role in rlep_names}

    def wrap(self, role):
        real = self.real[role]
        signature = inspect.signature(real)

        def recorder(*args, **kwargs):
            if role == "groups":
                # make_groups(cfg, part, step, ...): step counts from 0
                self.current_step = signature.bind(*args, **kwargs).arguments["step"] + 1
            result = real(*args, **kwargs)
            if self.current_step == self.step and role != "groups":
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                self.calls[role].append((dict(bound.arguments), result))
            return result
        return recorder

    def __enter__(self):
        self.stack = contextlib.ExitStack()
        for role in ["groups"] + recorded_roles:
            self.stack.enter_context(mock.patch.object(*home(role), self.wrap(role)))
        return self

    def __exit__(self, *exc):
        self.stack.close()


def run_step(model_path: str, engine, out_dir: str) -> dict:
    """The tiny preset's parts as rlep.main runs them, on `engine`, with phase two recorded;
    the shown step's numbers (full precision; "raw" keeps the off-policy mini-batch's
    tensors for the test's hand computation)."""
    from transformers import AutoTokenizer
    cfg = rlep.parse_config(preset_flags + ["--out_dir", out_dir])
    single = ranks.Dist(False, 0, 1, torch.device("cpu"), True)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    end_id = rlep.end_token_id(tokenizer, cfg.stop_token)
    train_rows = data.read_rows(cfg.train_file)
    rlep.train(cfg, "phase1", train_rows, engine, tokenizer, end_id, model_path, single, [])
    rlep.collect(cfg, train_rows, engine, tokenizer, end_id, single)
    with Recording(shown_step) as recording:
        rlep.phase_two(cfg, None, train_rows, engine, tokenizer, end_id, model_path, single, [])
    return step_numbers(recording, cfg, tokenizer)


def decoded(tokenizer, ids) -> str:
    """Token ids as text, special tokens kept, control characters escaped."""
    text = tokenizer.decode(ids)
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def step_numbers(recording: Recording, cfg, tokenizer) -> dict:
    """The recorded calls as the page's numbers: the step's prompts, the shown group (the first
    rescue of the off-policy mini-batch), both mini-batches, the off-policy one's tokens."""
    calls = recording.calls
    real_loss = recording.real["loss"]
    group_calls = calls["group"]  # one per prompt, in the step's order (= its position)
    penalties = [result for _, result in calls["penalty"]]
    # each mini-batch's micro-batches as collate made them, in the order the planner gave them
    collated = iter(result for _, result in calls["collate"])
    mini_batches = [[next(collated) for _ in result] for _, result in calls["mini_batch"]]
    positions = [[int(p) for p in args["positions"]] for args, _ in calls["mini_batch"]]
    mini_batch_of = {p: k for k, run in enumerate(positions) for p in run}
    group_size = cfg.n + cfg.replay_m  # build_group grades each of n + m with one penalty
    prompts = []
    for position, (args, group) in enumerate(group_calls):
        visit = recording.real["visit"](group)
        prompts.append({"position": position, "id": args["row"]["id"],
                        "problem": args["row"]["problem"], "answer": args["row"]["answer"],
                        "fresh_correct": visit["fresh_correct"],
                        "replays_correct": sum(s.correct for s in group if s.replay),
                        "pooled": len(args["row"]["responses"]),
                        "mini_batch": mini_batch_of[position] + 1, "rescued": visit["rescued"]})
    # the shown prompt: the first rescue of the off-policy mini-batch, else its first group
    # with mixed rewards (the test then asks for another shown_step)
    offpolicy = len(mini_batches) - 1
    candidates = [p for p in prompts if p["mini_batch"] == offpolicy + 1
                  and 0 < p["fresh_correct"] + p["replays_correct"] < group_size]
    shown = next((p for p in candidates if p["rescued"]), candidates[0])
    position = shown["position"]
    args, group = group_calls[position]
    advantage_args, advantages = calls["advantages"][position]
    rewards = advantage_args["rewards"]
    samples = []
    for i, s in enumerate(group):
        samples.append({
            "text": decoded(tokenizer, s.completion_ids), "length": len(s.completion_ids),
            "correct": s.correct, "penalty": penalties[position * group_size + i],
            "reward": s.reward, "replay": s.replay, "advantage": s.advantage})
    group_numbers = {
        **shown, "prompt": tokenizer.decode(args["prompt_ids"]),
        "drawn": list(calls["replays"][position][1]), "samples": samples,
        "rewards": rewards.tolist(), "advantages": advantages.tolist(),
        # group_advantages divides by these and returns neither: the same torch calls
        "mean": rewards.mean().item(), "std": rewards.std().item()}

    # every policy_loss call, by micro-batch: its advantages tensor is the micro-batch's own
    loss_calls = {id(args["advantages"]): (args, result) for args, result in calls["loss"]}
    batches, raw, tokens = [], [], []
    for k, mini_batch in enumerate(mini_batches):
        micro_losses, log_ratios = [], []
        fresh_tokens = replay_tokens = 0
        for micro in mini_batch:
            loss_args, (loss, metrics) = loss_calls[id(micro["advantages"])]
            micro_losses.append(loss.item())
            mask = loss_args["mask"].bool()
            log_ratio = loss_args["logprobs"].detach() - loss_args["old_logprobs"]
            log_ratios.append(log_ratio[mask].abs().max().item())
            for i, s in enumerate(micro["samples"]):
                if s.replay:
                    replay_tokens += len(s.completion_ids)
                else:
                    fresh_tokens += len(s.completion_ids)
            if k == offpolicy:
                raw.append({key: loss_args[key].detach().clone() for key in
                            ("logprobs", "old_logprobs", "advantages", "mask")}
                           | {"num_tokens": loss_args["num_tokens"], "loss": loss.item()})
                tokens += token_numbers(micro, loss_args, real_loss, tokenizer, group)
        batches.append({
            "number": k + 1, "positions": positions[k],
            "N": loss_calls[id(mini_batch[0]["advantages"])][0]["num_tokens"],
            "fresh_tokens": fresh_tokens, "replay_tokens": replay_tokens,
            "micro_losses": micro_losses, "loss": sum(micro_losses),
            "max_abs_log_ratio": max(log_ratios), "micro_batches": len(micro_losses)})
    update_args, (stats, _) = calls["update"][0]
    total = sum(len(group) for _, group in group_calls)
    return {
        "step": shown_step, "flags": preset_flags, "seed": cfg.seed, "n": cfg.n,
        "m": cfg.replay_m, "prompts_per_step": cfg.prompts_per_step,
        "mini_batch_prompts": cfg.mini_batch_prompts, "lr": cfg.lr,
        "max_response_len": cfg.max_response_len, "overlong_buffer": cfg.overlong_buffer,
        "phase1_steps": cfg.phase1_steps, "collect_step": cfg.collect_step,
        "collect_k": cfg.collect_k, "collect_temperature": cfg.collect_temperature,
        "min_successes": cfg.min_successes,
        "clip_low": cfg.clip_low, "clip_high": cfg.clip_high, "clip_c": cfg.clip_c,
        "sequences": total, "sequences_per_update": update_args["sequences_per_update"],
        "prompts": prompts, "group": group_numbers, "mini_batches": batches,
        "offpolicy": offpolicy + 1,
        "tokens": pick_tokens(tokens, cfg.clip_low, cfg.clip_high, cfg.clip_c),
        "update": {key: stats[key] for key in ("clip_frac", "dual_clip_frac", "ratio_mean",
                                               "ratio_max", "grad_norm")},
        "raw": raw}


def token_numbers(micro, loss_args, real_loss, tokenizer, shown_group):
    """Each response token of a micro-batch, its numbers from policy_loss on it alone: the
    ratio (ratio_mean of one token), the clip decisions (clip_frac, dual_clip_frac) and its
    loss with N = 1. log π_θ: TokenLogProbs, as policy_loss received it."""
    shown_ids = {id(s): i for i, s in enumerate(shown_group)}
    found = []
    for i, s in enumerate(micro["samples"]):
        for t, token_id in enumerate(s.completion_ids):
            one = (slice(i, i + 1), slice(t, t + 1))
            loss, metrics = real_loss(
                loss_args["logprobs"][one].detach(), loss_args["old_logprobs"][one],
                loss_args["advantages"][i:i + 1], torch.ones(1, 1), loss_args["clip_low"],
                loss_args["clip_high"], loss_args["clip_c"], num_tokens=1)
            found.append({
                "prompt": s.row_id, "response": shown_ids.get(id(s)), "replay": s.replay,
                "t": t, "token": decoded(tokenizer, [token_id]),
                "context": decoded(tokenizer, s.completion_ids[:t]),
                "last": t == len(s.completion_ids) - 2, "advantage": s.advantage,
                "logprob": loss_args["logprobs"][i, t].item(),
                "old_logprob": loss_args["old_logprobs"][i, t].item(),
                "ratio": metrics["ratio_mean"].item(),
                "clipped": bool(metrics["clip_frac"].item()),
                "dual_clipped": bool(metrics["dual_clip_frac"].item()),
                "token_loss": loss.item()})
    return found


# The cases of DAPO's clipped loss by Â and r, in the page's order ("inside": within
# [1 - ε_low, 1 + ε_high]); policy_loss clips the third and fourth, dual-clips the seventh
token_cases = ["Â > 0, r < 1 - ε_low", "Â > 0, r inside", "Â > 0, r > 1 + ε_high",
               "Â < 0, r < 1 - ε_low", "Â < 0, r inside", "Â < 0, r > 1 + ε_high",
               "Â < 0, r > c", "Â = 0"]


def token_case(token: dict, low: float, high: float, c: float) -> str:
    """A token's case, by its Â and r (the ranges only; the decision is policy_loss's)."""
    a, r = token["advantage"], token["ratio"]
    if a == 0:
        return "Â = 0"
    side = "r < 1 - ε_low" if r < 1 - low else "r > 1 + ε_high" if r > 1 + high else "r inside"
    if a < 0 and r > c:
        side = "r > c"
    return f"Â {'>' if a > 0 else '<'} 0, {side}"


def pick_tokens(tokens: list[dict], low: float, high: float, c: float) -> dict:
    """The shown group's answer tokens (the last before the end token), one per distinct
    response with its count; the mini-batch's tokens counted by case, and of each case the
    token whose r is farthest from 1."""
    mine = {}
    for token in tokens:
        if token["response"] is not None and token["last"]:
            key = (token["context"], token["token"])
            mine.setdefault(key, {**token, "count": 0})["count"] += 1
    counts = collections.Counter()
    farthest = {}
    for token in tokens:
        case = token_case(token, low, high, c)
        counts[case] += 1
        if case not in farthest or abs(token["ratio"] - 1) > abs(farthest[case]["ratio"] - 1):
            farthest[case] = token
    return {"group": list(mine.values()), "counts": dict(counts),
            "examples": [farthest[name] for name in token_cases if name in farthest]}


class Page:
    """The page's numbers, each formatted once: `num` returns the text the page prints and
    keeps it under a name, for the machine-readable block the test compares with a new run."""

    def __init__(self):
        self.shown = {}

    def num(self, name: str, value, spec: str = ".4f") -> str:
        text = format(value, spec)
        if self.shown.setdefault(name, text) != text:
            raise ValueError(f"{name} is shown as both {self.shown[name]} and {text}")
        return text

    def block(self) -> str:
        # "--" may not occur in an HTML comment: escaped, the JSON reads the same
        shown = json.dumps(self.shown, indent=0, ensure_ascii=False).replace("--", "-\\u002d")
        return f"<!-- worked-step numbers\n{shown}\n-->\n"


def read_block(page_text: str) -> dict:
    """The numbers block of a page written by `render`."""
    found = re.search(r"<!-- worked-step numbers\n(.*?)\n-->", page_text, re.S)
    return json.loads(found.group(1)) if found else {}


def code(text: str) -> str:
    """Text as a code span in a table cell: GitHub reads an escaped pipe there as a pipe."""
    ticks = "``" if "`" in text else "`"
    return f"{ticks}{text.replace('|', chr(92) + '|')}{ticks}"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def reflow(text: str, width: int = 100) -> str:
    """Prose paragraphs filled to `width`; tables, code, formulas and headings as written. A
    line never starts with a sign or a list marker (Markdown would read a list there)."""
    out, words, fenced = [], [], False

    def loose(word):  # an operator or a list marker: kept with its neighbours
        return re.fullmatch(r"[-+*>=<]|\d+\.", word)

    def flush():
        lines = []
        for word in words:
            joined = lines and (loose(word) or loose(lines[-1].rsplit(" ", 1)[-1]))
            if lines and (len(lines[-1]) + 1 + len(word) <= width or joined):
                lines[-1] += " " + word
            else:
                lines.append(word)
        out.extend(lines)
        words.clear()
    for line in text.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        if fenced or line.startswith(("```", "|", "    ", "#", "<!--")) or not line.strip():
            flush()
            out.append(line)
        else:
            # a code span is one word
            words.extend(re.findall(r"\S*`[^`]*`\S*|\S+", line))
    flush()
    return "\n".join(out)


def signed_sum(terms: list[str]) -> str:
    """'+0.1', '-0.2', '+0.3' as '0.1 - 0.2 + 0.3' (the first term's sign kept on it)."""
    text = " ".join(f"{t[0]} {t[1:]}" for t in terms[1:])
    first = terms[0][1:] if terms[0].startswith("+") else terms[0]
    return f"{first} {text}" if text else first


def render(numbers: dict) -> str:
    """The page: the run, the step's prompts, one group from rewards to Â, the two mini-batches,
    the off-policy one's tokens and loss, ppo_update's summary; the numbers block last."""
    page = Page()
    num = page.num
    n, m, step = numbers["n"], numbers["m"], numbers["step"]
    group = numbers["group"]
    low, high, c = numbers["clip_low"], numbers["clip_high"], numbers["clip_c"]
    l_max, buffer = numbers["max_response_len"], numbers["overlong_buffer"]
    flags = " ".join(numbers["flags"])
    out = []
    out.append(f"""# One training step, worked through

Every number on this page was computed by rlep.py during a real run, and recorded as it ran: each
function named beside a number was wrapped by a recorder that kept its arguments and its result.
The page shows one prompt of one phase-two step: its n + m responses, their rewards and
advantages, then the loss of the step's off-policy mini-batch, token by token. It is generated;
do not edit it by hand:

```bash
{command}    # under a minute: phase one, the collection, phase two
```

`tests/test_worked_step.py` runs the same step again and fails if a number here differs from the
run's by more than another CPU's rounding moves it (5 in its last digit and 0.1 % of it), if any
other text differs, or if the run's numbers break the rules it writes out by hand (the advantage,
the ratio, the clip, the loss).

**The run.** `rlep.py {flags}`, seed {numbers['seed']}, float32 on the CPU, where a run with the
same seeds is bit-reproducible on one machine (the resume tests rely on it); another CPU's kernels
round differently (a 2-core AMD EPYC with AVX2 only moved these numbers by up to 3 in their last
digit). The tiny preset: a 116k-parameter
Qwen2 (one token per character) taught the answer format, on single-digit sums and differences.
Phase one trains the baseline for {numbers['phase1_steps']} steps; {fn('collect')} samples
K = {numbers['collect_k']} answers per training prompt from its step-{numbers['collect_step']}
checkpoint (T = {numbers['collect_temperature']:g}) and pools the prompts with at least
{numbers['min_successes']} verified ones; phase two restarts from the base model on the pool's
prompts. Validation is off (`--val_every 0`): it draws its own seeds and changes no number
here, so this step is step {step} of phase two of `python rlep.py --preset tiny` too.
""")

    # the step's prompts
    rows = []
    for p in numbers["prompts"]:
        rows.append([str(p["position"]), code(p["problem"]), p["answer"],
                     f"{p['fresh_correct']} / {n}", f"{p['replays_correct']} / {m}",
                     str(p["mini_batch"]), "yes" if p["rescued"] else ""])
    why = "a rescue" if group["rescued"] else "mixed rewards (no rescue in that mini-batch)"
    out.append(f"""## The step's prompts

Phase two's step {step} visits {numbers['prompts_per_step']} of the pool's prompts. Each gets
n = {n} fresh rollouts from the current policy and m = {m} answers replayed from the pool
({fn('replays')}: drawn without replacement, anew at each visit); {fn('group')} grades all
n + m. A prompt is *rescued* ({fn('visit')}) when every fresh rollout is wrong and a replay right:
its only learning signal is the replays'.

""" + table(["position", "problem", "answer", "fresh correct", "replays correct", "mini-batch",
             "rescued"], rows) + f"""
correct: {fn('group')} (verify.py); mini-batch: {fn('plan')}; rescued: {fn('visit')}.
""" + f"""

The page follows **{group['problem']}** (answer {group['answer']}): {why}, and in the off-policy
mini-batch (mini-batch {numbers['offpolicy']}, below), so its tokens show a ratio other than 1.
""")

    # the group
    rows = []
    for i, s in enumerate(group["samples"]):
        rows.append([str(i + 1), code(s["text"]), str(s["length"]),
                     "yes" if s["correct"] else "no",
                     num(f"response {i + 1} penalty", s["penalty"] + 0.0, "+.2f"),
                     num(f"response {i + 1} reward", s["reward"], "+.2f"),
                     "replay" if s["replay"] else "fresh",
                     num(f"response {i + 1} advantage", s["advantage"], "+.4f")])
    mean = num("group mean", group["mean"])
    std = num("group std", group["std"])
    worked = []
    for reward, advantage in dict(zip(group["rewards"], group["advantages"])).items():
        worked.append(f"    ({reward:+.2f} - ({mean})) / ({std} + 1e-6) = "
                      f"{num(f'advantage of reward {reward:+.2f}', advantage, '+.4f')}")
    worked = "\n".join(worked)
    out.append(f"""## One group: the rewards and the advantages

The prompt as the policy sees it (`render_prompt`: the chat template, then the generation prompt):

```text
{group['prompt']}
```

The pool holds {group['pooled']} verified answers for it; {fn('replays')} drew {m} of them, the
last {m} rows below. A response is shown as its tokens decoded, the end token `<|im_end|>`
included; its length in tokens counts the end token.

""" + table(["#", "response", "tokens", "correct", "penalty", "R", "kind", "Â"], rows) + f"""
correct, R: {fn('group')}; penalty: {fn('penalty')}; Â: {fn('advantages')}.

**The reward** ({fn('group')}): R = +1 if verify.py finds the answer right, else -1, plus DAPO's
overlong penalty ({fn('penalty')}): 0 up to L_max - L_cache = {l_max} - {buffer} = {l_max - buffer}
tokens, then linearly down to -1 at L_max = {l_max}. A replay is graded like a fresh response, by
the same rule.

**The advantage** ({fn('advantages')}) standardises the rewards over all n + m = {n + m} of the
group, fresh and replayed alike, with the unbiased standard deviation (divisor n + m - 1):

    Â_i = (R_i - mean R) / (std R + 1e-6)
    mean R = {mean}    std R = {std}
{worked}

(mean and std are the rewards' `torch.mean` and `torch.std`, the two numbers
{fn('advantages')} divides by; it returns only Â.) Without the replays the {n} fresh rewards
would all be -1: std 0, every Â = 0, and the prompt would teach nothing. With them, the fresh
wrong answers are pushed down and the pooled right one up.
""")

    # the mini-batches
    batches = numbers["mini_batches"]
    off = batches[numbers["offpolicy"] - 1]
    rows = []
    for b in batches:
        k = b["number"]
        problems = ", ".join(numbers["prompts"][p]["problem"] for p in b["positions"])
        rows.append([str(k), f"{b['positions'][0]}-{b['positions'][-1]} ({problems})",
                     f"{num(f'mini-batch {k} N', b['N'], 'd')} = "
                     f"{num(f'mini-batch {k} fresh tokens', b['fresh_tokens'], 'd')} + "
                     f"{num(f'mini-batch {k} replay tokens', b['replay_tokens'], 'd')}",
                     str(b["micro_batches"]), num(f"mini-batch {k} loss", b["loss"], "+.6f"),
                     num(f"mini-batch {k} max |log r|", b["max_abs_log_ratio"], ".4f")])
    micro_sum = signed_sum([num(f'mini-batch {off["number"]} micro-batch {j + 1} loss', x, '+.6f')
                            for j, x in enumerate(off['micro_losses'])])
    sequences, per_update = numbers["sequences"], numbers["sequences_per_update"]
    half_even = ""
    if sequences / per_update % 1 == 0.5:
        half_even = f" (Python rounds {sequences / per_update:g} to the even {len(batches)})"
    out.append(f"""## The update: two mini-batches, one of them off-policy

{fn('update')} makes max(1, round({sequences} / {per_update})) = {len(batches)} optimizer steps
this step: its {sequences} sequences ({numbers['prompts_per_step']} prompts x (n + m)) over
mini_batch_prompts x n = {numbers['mini_batch_prompts']} x {n} = {per_update} sequences an
update{half_even}. `{rlep_names['plan']}` splits the step's prompts into runs of
positions; each mini-batch holds whole groups. log π_θold is taken once, at the step's start
({fn('old_logprobs')}): for mini-batch 1 it is the training forward itself (the policy has not
moved yet), for mini-batch 2 a no-grad pass before the first update. So mini-batch 1 trains with
r = 1 exactly, and mini-batch 2 with a policy one AdamW step
(lr {num('lr', numbers['lr'], 'g')}) past π_θold.

""" + table(["mini-batch", "positions (prompts)", "N = fresh + replay tokens",
             "micro-batches", "loss", "max \\|log r\\|"], rows) + f"""
positions: {fn('plan')}; N: {fn('update')}; loss: the sum of {fn('loss')} over the
micro-batches; log r = log π_θ - log π_θold, as {fn('loss')} received them.

N counts every response token of the mini-batch, replays included, the end token included
({fn('update')}). A micro-batch's {fn('loss')} is its tokens' loss summed, divided by that N:
{fn('update')} backpropagates each, so the mini-batch's loss is the sum over its micro-batches
({micro_sum} = {num(f'mini-batch {off["number"]} loss', off['loss'], '+.6f')} for mini-batch
{off['number']}).
""")

    # the tokens
    def token_row(name, t):
        """A token's Â, log π_θ, log π_θold, π_θ, π_θold, r, clip decision and loss."""
        decision = "no"
        if t["dual_clipped"]:
            decision = "dual clip (c)"
        elif t["clipped"]:
            decision = "at 1 + ε_high" if t["advantage"] > 0 else "at 1 - ε_low"
        return [num(f"{name} Â", t["advantage"], "+.4f"),
                num(f"{name} log π_θ", t["logprob"]),
                num(f"{name} log π_θold", t["old_logprob"]),
                num(f"{name} π_θ", math.exp(t["logprob"])),
                num(f"{name} π_θold", math.exp(t["old_logprob"])),
                num(f"{name} ratio", t["ratio"]), decision,
                num(f"{name} loss", t["token_loss"], "+.4f")]
    header = ["Â", "log π_θ", "log π_θold", "π_θ", "π_θold", "r", "clipped", "token loss"]
    rows = []
    for t in numbers["tokens"]["group"]:
        response = t["response"] + 1
        count = f" (x{t['count']})" if t["count"] > 1 else ""
        rows.append([f"{response}{count}", code(f"{t['context']}[{t['token']}]"),
                     "replay" if t["replay"] else "fresh"]
                    + token_row(f"response {response} answer token", t))
    group_table = table(["#", "token", "kind"] + header, rows)
    rows = []
    problems = {p["id"]: p["problem"] for p in numbers["prompts"]}
    for t in numbers["tokens"]["examples"]:
        case = token_case(t, low, high, c)
        name = f"example {case}"
        count = num(f"tokens {case}", numbers["tokens"]["counts"][case], "d")
        rows.append([case, count, code(problems[t["prompt"]]),
                     code(f"{t['context']}[{t['token']}]")] + token_row(name, t))
    example_table = table(["case", "count", "prompt", "token"] + header, rows)
    absent = [name for name in token_cases if name not in numbers["tokens"]["counts"]]
    out.append(f"""## The loss of the off-policy mini-batch, token by token

DAPO's loss ({fn('loss')}), no KL term: with r_it = π_θ(o_it) / π_θold(o_it),

    token loss  l_it = max(-r_it Â_i, -clip(r_it, 1 - ε_low, 1 + ε_high) Â_i)
                       and, where Â_i < 0, at most -c Â_i            (the dual clip)
    L = (1/N) Σ_i Σ_t l_it        ε_low = {num('ε_low', low, 'g')}, \
ε_high = {num('ε_high', high, 'g')}, c = {num('c', c, 'g')}, N = {off['N']}

log π_θ is the policy's forward ({fn('logprobs')}, logits / T), log π_θold
{fn('old_logprobs')}'s. Each row's r, clip decision and token loss are {fn('loss')} called on
that token alone (N = 1); π = exp(log π), for reading. A token is shown in brackets after the
tokens before it. The answer tokens of {group['problem']}'s responses (the token before the end
token; of identical responses the first, with their count):

""" + group_table + f"""
A wrong fresh answer has Â < 0: its token loss is -r·Â > 0, and lowering its probability lowers
the loss. The replayed right answer has Â > 0: raising its probability lowers the loss.

The mini-batch's {off['N']} tokens by case, each case with its token whose r is farthest from 1
(any prompt of the mini-batch):

""" + example_table + f"""
The clip stops a token's gradient only where the policy has already moved it far enough the way
Â asks: a wrong answer (Â < 0) that became less likely (r < 1 - ε_low), or a right one (Â > 0)
that became more likely (r > 1 + ε_high). A wrong answer that became *more* likely keeps -r·Â and
its full gradient: the loss takes the larger of the two terms. The dual clip caps that loss only
beyond r > c = {c:g}. Cases absent from this mini-batch: {'; '.join(absent) if absent else 'none'}.
""")

    update = numbers["update"]
    micro_count = sum(b["micro_batches"] for b in batches)
    out.append(f"""## What the step reports

{fn('update')} returns the step's summary, in the row of `phase2/metrics.jsonl` for step {step}:

| clip_frac | dual_clip_frac | ratio_mean | ratio_max | grad_norm |
|---|---|---|---|---|
| {num('clip_frac', update['clip_frac'], '.6f')} | \
{num('dual_clip_frac', update['dual_clip_frac'], '.6f')} | \
{num('ratio_mean', update['ratio_mean'], '.6f')} | {num('ratio_max', update['ratio_max'])} | \
{num('grad_norm', update['grad_norm'])} |

clip_frac, dual_clip_frac and ratio_mean are means over the step's {micro_count} micro-batches,
both mini-batches included (each micro-batch's a token mean); ratio_max is the largest r;
grad_norm the mean over the {len(batches)} optimizer steps of the gradient norm before its clip
at 1.
""")
    return reflow("\n".join(out)) + "\n" + page.block()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--print", action="store_true", help="the page on stdout only")
    args = parser.parse_args()
    cfg = rlep.parse_config(preset_flags)
    model_path = hub.model_folder(cfg.model_path, os.path.join(repo, cfg.cache_dir))
    engine = rlep.build_engine(cfg, model_path, ranks.Dist(False, 0, 1, torch.device("cpu"), True))
    try:
        with tempfile.TemporaryDirectory() as out_dir:
            numbers = run_step(model_path, engine, out_dir)
    finally:
        engine.shutdown()
    text = render(numbers)
    if args.print:
        print(text)
        return
    with open(page_path, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {os.path.relpath(page_path)}")


if __name__ == "__main__":
    main()
