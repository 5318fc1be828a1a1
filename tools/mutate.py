"""Mutation check: each named edit of RLEP's method, applied to a temporary copy of the
repository, must make the fast tests fail ("killed"). A mutation whose pattern no longer
occurs exactly once is reported stale (the code moved: update its pattern), never passed.

    python tools/mutate.py              # every mutation: one line each, then the total
    python tools/mutate.py NAME ...     # only these
    python tools/mutate.py --list
    python tools/mutate.py --equivalent # the edits judged equivalent: each should survive

A mutation runs the fast tests, or the tests it names (a file or a pytest node id each): the
unmutated copy must pass those of the mutations chosen. Its edit is one (pattern, replacement),
or a tuple of patterns and one of replacements applied together (an edit in two places).
The tests that can see the edit run first (those whose code names the function it is in, or,
outside a function, a name in its pattern), the quick tier's first among either kind, and
pytest stops at the first failure (-x): a killed mutation costs seconds. This file is the
pytest plugin (-p mutate) that orders them.
Exits 0 only when the unmutated copy passes and every mutation is killed. A script, not a
test (pytest does not collect it); it takes minutes, outside CI's time."""
import argparse
import ast
import inspect
import keyword
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the tests that must catch every mutation, quickest to fail first
fast_tests = ["tests/test_loss.py", "tests/test_paper.py", "tests/test_data.py",
              "tests/test_replay_variants.py"]

# (name, file, pattern, replacement[, tests]): the pattern (each of a tuple of them) must occur
# exactly once in the file; tests: the ones that must catch it, else fast_tests
guarantees = "tests/test_guarantees.py::"
killed_saves = guarantees + "test_a_save_or_prune_killed_at_any_write_leaves_only_whole_checkpoints"
paper_rule = guarantees + "test_the_paper_rule_reads_answers_as_math_dapo"
eval_protocol = guarantees + "test_eval_defaults_are_the_papers_protocol"
chat_rows = guarantees + "test_a_chat_row_is_rendered_from_its_own_messages_a_plain_one_templated"
dynamic = "tests/test_dynamic_sampling.py::"
both_rules = ("tests/test_eval.py::"
              "test_a_boxed_only_answer_is_right_by_equivalence_and_wrong_by_the_paper_rule")
planner = "tests/test_planner.py"
two_rank_update = "tests/test_update.py::test_one_rank_and_two_ranks_make_the_same_update"
update_tests = "tests/test_update.py::"
uneven_lockstep = (update_tests + "test_a_rank_with_fewer_micro_batches_than_the_passes_adds_"
                   "nothing_to_the_update")
bf16_update = update_tests + "test_a_bf16_run_gathers_bf16_weights_and_reduces_gradients_in_fp32"
epoch_orders = update_tests + "test_each_later_epoch_takes_the_mini_batches_in_its_own_seeded_order"
checkpointing = ("tests/test_load.py::"
                 "test_the_policy_recomputes_its_layers_in_backward_with_gradient_checkpointing")
sync = "tests/test_vllm_sync.py::"
stale_part = sync + "test_the_push_guard_catches_a_small_stale_part_of_a_fused_parameter"
bad_input = "tests/test_bad_input.py::"
resume_fields = (bad_input + "test_fields_free_on_resume_are_config_fields_and_auto_takes_the_"
                 "runs_dtype")
refusals = [resume_fields, bad_input + "test_python_rlep_py_prints_one_line_and_exits_2",
            bad_input + "test_bad_input_is_refused_before_anything_is_written"]
tensor_row = "tests/test_ranks.py::test_a_row_carrying_a_tensor_is_refused_by_the_exchange"
mutations = [
    # the loss
    ("eps swapped in the clip", "rlep.py",
     "ratio.clamp(1 - clip_low, 1 + clip_high)", "ratio.clamp(1 - clip_high, 1 + clip_low)"),
    ("eps swapped in the update's call", "rlep.py",
     "cfg.clip_low, cfg.clip_high, cfg.clip_c", "cfg.clip_high, cfg.clip_low, cfg.clip_c"),
    ("dual clip dropped", "rlep.py",
     "per_token_loss = torch.where(adv < 0, dual_clipped, pessimistic)",
     "per_token_loss = pessimistic"),
    ("dual clip at a fixed c = 10", "rlep.py", "-adv * clip_c)", "-adv * 10.0)"),
    ("per-sequence mean", "rlep.py", "loss = (per_token_loss * mask).sum() / num_tokens",
     "loss = ((per_token_loss * mask).sum(1) / mask.sum(1)).mean()"),
    ("N per micro-batch", "rlep.py", "num_tokens=num_tokens[u])", "num_tokens=None)"),
    # the advantage
    ("population std", "rlep.py", "groups.std(dim=1, keepdim=True)",
     "groups.std(dim=1, keepdim=True, unbiased=False)"),
    ("fresh-only standardisation", "rlep.py",
     "scored = group  # RLEP", "scored = group[:len(completions)]  # RLEP"),
    # the reward
    ("overlong sign flipped", "rlep.py", "reward = (1.0 if correct else -1.0) + penalty",
     "reward = (1.0 if correct else -1.0) - penalty"),
    ("overlong factor ignored", "rlep.py", "cfg.overlong_factor)", "1.0)"),
    ("overlong window from L_max - 2 L_cache", "rlep.py",
     "length - (max_len - buffer_len)", "length - (max_len - 2 * buffer_len)"),
    ("reward 0/1 instead of +-1", "rlep.py", "reward = (1.0 if correct else -1.0) + penalty",
     "reward = (1.0 if correct else 0.0) + penalty"),
    ("replays not re-verified", "rlep.py",
     'correct = verify.verify(text, row["answer"], mode=cfg.verify_mode)',
     'correct = replay or verify.verify(text, row["answer"], mode=cfg.verify_mode)'),
    ("reward ignores the paper rule", "rlep.py",
     'correct = verify.verify(text, row["answer"], mode=cfg.verify_mode)',
     'correct = verify.verify(text, row["answer"])'),
    ("replays not ended", "rlep.py",
     "ids = tokenizer.encode(text, add_special_tokens=False) + [end_id]",
     "ids = tokenizer.encode(text, add_special_tokens=False)"),
    ("replays not cut to L_max", "rlep.py",
     "candidates.append((ids[:cfg.max_response_len], None, True))",
     "candidates.append((ids, None, True))"),
    ("paper rule window dropped", "verify.py",
     'matches = re.findall(r"(?i)Answer\\s*:\\s*([^\\n]+)", response[-300:])',
     'matches = re.findall(r"(?i)Answer\\s*:\\s*([^\\n]+)", response)'),
    ("paper rule window 400", "verify.py", "response[-300:]", "response[-400:]"),
    # replay
    ("replays with replacement", "rlep.py", "replace=False)", "replace=True)"),
    ("none replayed when fewer than m", "rlep.py",
     "if len(responses) <= m:  # RLEP: fewer than m: the authors' code takes them all\n"
     "        return list(responses)",
     "if len(responses) <= m:  # RLEP: fewer than m: the authors' code takes them all\n"
     "        return []"),
    ("replays drawn once per prompt", "rlep.py",
     "rng = np.random.default_rng(seed)  # RLEP",
     'rng = np.random.default_rng(seed_for(cfg.seed, part, row["id"]))  # RLEP'),
    ("phase two from the phase-one checkpoint", "rlep.py",
     'train(cfg, "phase2", rows, engine, tokenizer, end_id, base_path, d, val_rows, run,',
     'train(cfg, "phase2", rows, engine, tokenizer, end_id, checkpoints.checkpoint_path('
     'os.path.join(cfg.out_dir, "phase1"), cfg.collect_step), d, val_rows, run,'),
    # the collection
    ("collection from phase one's last checkpoint", "rlep.py", "engine.push(path=ckpt)",
     'engine.push(path=checkpoint_path(os.path.join(cfg.out_dir, "phase1"), '
     "cfg.phase1_steps))"),
    ("collection K ignored", "rlep.py", "cfg.collect_k, cfg, [end_id],", "cfg.n, cfg, [end_id],"),
    ("collection temperature ignored", "rlep.py",
     'temperature=cfg.collect_temperature,', 'temperature=cfg.temperature,'),
    ("collection top-p ignored", "rlep.py", "top_p=cfg.collect_top_p,", "top_p=cfg.top_p,"),
    ("min_successes ignored", "rlep.py", 'if len(successes[row["id"]]) >= cfg.min_successes]',
     'if len(successes[row["id"]]) >= 1]'),
    ("collection keeps unverified answers", "rlep.py",
     'right = [t for t, ok in zip(record["responses"], record["correct"]) if ok]',
     'right = list(record["responses"])'),
    # validation
    ("phase two validates on other draws", "rlep.py",
     "stop_ids, d, step=step + 1)", "stop_ids, d, step=step + 1 + 1000 * replay)"),
    ("phase two's step 0 on other draws", "rlep.py",
     "stop_ids, d, step=0)", 'stop_ids, d, step=int(part == "phase2"))'),
    # the optimiser
    ("warm-up removed", "rlep.py", "return cfg.lr * min(1.0, step / cfg.warmup_steps)",
     "return cfg.lr"),
    ("warm-up from lr / warmup_steps", "rlep.py", "min(1.0, step / cfg.warmup_steps)",
     "min(1.0, (step + 1) / cfg.warmup_steps)"),
    ("lr not applied", "rlep.py", 'group["lr"] = lr', 'group["lr"] = cfg.lr'),
    ("weight decay dropped", "rlep.py", "weight_decay=cfg.weight_decay, fused=True",
     "weight_decay=0.0, fused=True"),
    ("grad clip removed", "rlep.py", "clip_grad_norm_(policy.parameters(), cfg.grad_clip)",
     'clip_grad_norm_(policy.parameters(), float("inf"))'),
    ("grad clip at a fixed 1.0", "rlep.py", "clip_grad_norm_(policy.parameters(), cfg.grad_clip)",
     "clip_grad_norm_(policy.parameters(), 1.0)"),
    ("divergence check removed", "rlep.py",
     'if not (math.isfinite(stats["grad_norm"]) and fsdp.weights_finite(policy)):', "if False:",
     [bad_input + "test_a_diverged_run_stops_in_one_line_before_any_save"]),
    ("update count ignores replays", "rlep.py",
     "sum(len(g.row_lengths) for g in sizes.values())", "len(sizes) * cfg.n"),
    ("equal_updates ignored", "rlep.py",
     "per_prompt = cfg.n + cfg.replay_m if replay and cfg.equal_updates else cfg.n",
     "per_prompt = cfg.n"),
    ("equal_updates always on", "rlep.py",
     "per_prompt = cfg.n + cfg.replay_m if replay and cfg.equal_updates else cfg.n",
     "per_prompt = cfg.n + cfg.replay_m if replay else cfg.n"),
    ("autocast disabled", "rlep.py", 'enabled=cfg.dtype != "float32"', "enabled=False"),
    # the preset and main
    ("paper preset: collect_k 32", "rlep.py", "collect_k: int = 64", "collect_k: int = 32"),
    ("paper preset: warm-up 5", "rlep.py", "warmup_steps: int = 10", "warmup_steps: int = 5"),
    ("disk check removed from the start checks", "machinery/preflight.py",
     "disk_line = check_disk(cfg, model_path, len(inputs[0]), world_size)", 'disk_line = ""'),
    # what the suite let change (tests/test_guarantees.py)
    ("long prompts cut from their end", "rlep.py", '["input_ids"][-max_len:]',
     '["input_ids"][:max_len]',
     [guarantees + "test_a_long_prompt_keeps_its_end_and_loses_its_start"]),
    ("a chat row templated again", "rlep.py", 'messages = row.get("prompt") or [user]',
     "messages = [user]", [chat_rows]),
    ("the prompt template ignored", "rlep.py", 'template.format(problem=row["problem"])',
     'row["problem"]', [chat_rows]),
    ("no generation prompt", "rlep.py", "add_generation_prompt=True,",
     "add_generation_prompt=False,",
     [guarantees + "test_a_long_prompt_keeps_its_end_and_loses_its_start"]),
    ("N without the replays' tokens", "machinery/planner.py",
     "GroupSize(position, sum(len(s.completion_ids) for s in group),",
     "GroupSize(position, sum(len(s.completion_ids) for s in group if not s.replay),",
     [guarantees + "test_n_counts_the_replays_tokens"]),
    # the planner: rows dealt to the ranks, as many passes on each
    ("passes rounded down", "machinery/planner.py", "passes = -(-len(cut(rows, 0)) // world_size)",
     "passes = max(1, len(cut(rows, 0)) // world_size)", [planner]),
    ("shared groups by position", "machinery/planner.py",
     "if sizes[p].rank == r] for r in range(world_size)]",
     "if p % world_size == r] for r in range(world_size)]", [planner]),
    ("received rows dropped", "machinery/ranks.py",
     "items += kept if rank == d.rank else pickle.loads(part.numpy())",
     "items += kept if rank == d.rank else pickle.loads(part.numpy())[1:]", [two_rank_update]),
    ("pi_old's pass over the first mini-batch too", "rlep.py",
     "for mini_batch in mini_batches[1:]:", "for mini_batch in mini_batches:",
     [guarantees + "test_old_logprobs_take_one_pass_and_none_for_the_first_mini_batch"]),
    ("pi_old's shortcut keeps its gradient", "rlep.py",
     "keep_old_logprobs(micro, logprobs.detach())",
     "keep_old_logprobs(micro, logprobs)",
     [guarantees + "test_the_first_update_is_the_token_mean_policy_gradient"]),
    ("pi_old's shortcut in every epoch", "rlep.py", "if epoch == 0 and u == 0:", "if k == 0:",
     ["tests/test_update.py::test_the_second_epoch_uses_the_old_logprobs_of_the_steps_start"]),
    ("pi_old from the moving policy", "rlep.py", "if epoch == 0 and u == 0:", "if epoch == 0:",
     ["tests/test_update.py::test_the_second_epoch_uses_the_old_logprobs_of_the_steps_start"]),
    ("validation records in rank order", "rlep.py",
     'return sorted(ranks.gather_to_rank0(records, d), key=lambda r: order[r["id"]])',
     "return ranks.gather_to_rank0(records, d)",
     [guarantees + "test_on_two_ranks_each_sources_accuracy_is_its_own"]),
    ("validation's k from n", "rlep.py", "cfg.val_k, cfg, stop_ids, d,", "cfg.n, cfg, stop_ids, d,",
     [guarantees + "test_val_acc_is_the_mean_over_all_samples_of_all_problems"]),
    ("val_acc as pass@k", "rlep.py",
     'scores = {"val_acc": float(np.mean([c for r in records for c in r["correct"]]))}',
     'scores = {"val_acc": float(np.mean([any(r["correct"]) for r in records]))}',
     [guarantees + "test_val_acc_is_the_mean_over_all_samples_of_all_problems"]),
    ("a source's accuracy as pass@k", "rlep.py",
     "by_source[f\"val_acc/{row.get('data_source')}\"] += record[\"correct\"]",
     "by_source[f\"val_acc/{row.get('data_source')}\"].append(any(record[\"correct\"]))",
     [guarantees + "test_val_acc_is_the_mean_over_all_samples_of_all_problems"]),
    ("rank 1 decides its own resume", "rlep.py",
     "ranks.rank0_decides(lambda: checkpoints.resume_point(part_dir), d)",
     "checkpoints.resume_point(part_dir)",
     ["tests/test_checkpoints.py::test_every_rank_takes_rank_0s_view_of_the_run"]),
    ("rank 1 decides its own collection", "rlep.py",
     "pooled, done = ranks.rank0_decides(where_to_start, d)",
     "pooled, done = where_to_start()",
     ["tests/test_checkpoints.py::test_every_rank_takes_rank_0s_view_of_the_run"]),
    ("rank 1 receives rank 0's collected answers", "rlep.py",
     "return written, set(successes_so_far)",
     "return written, successes_so_far",
     ["tests/test_checkpoints.py::test_the_other_ranks_never_receive_rank_0s_collected_answers"]),
    ("a refusal on rank 0 alone", "machinery/ranks.py", "        raise error\n    return answer",
     "        if d.master_process:\n            raise error\n    return answer",
     ["tests/test_checkpoints.py::test_rank_0s_answer_or_refusal_reaches_every_rank"]),
    ("main keeps a stopped save's leftovers", "rlep.py",
     "checkpoints.remove_leftovers(cfg.out_dir)", "pass",
     [guarantees + "test_a_stopped_saves_leftovers_count_as_free_and_go_only_after_the_checks"]),
    ("leftovers not counted as free space", "machinery/disk.py",
     "free = shutil.disk_usage(where).free + sum(map(folder_bytes, leftovers(cfg.out_dir)))",
     "free = shutil.disk_usage(where).free",
     [guarantees + "test_a_stopped_saves_leftovers_count_as_free_and_go_only_after_the_checks"]),
    ("checkpoint written in place", "machinery/checkpoints.py",
     ('tmp = final + ".tmp"', "shutil.rmtree(final, ignore_errors=True)\n        os.replace"),
     ("tmp = final", "os.replace"),
     [killed_saves]),
    ("the record written after the rename", "machinery/checkpoints.py",
     ("            # last: the record that makes it whole\n            write_record(tmp, step)\n",
      "        os.replace(tmp, final)\n"),
     ("", "        os.replace(tmp, final)\n        write_record(final, step)\n"),
     [killed_saves]),
    ("a pruned checkpoint deleted in place", "machinery/checkpoints.py",
     ('os.replace(folder, folder + ".deleting")\n'
      '                shutil.rmtree(folder + ".deleting")'),
     "shutil.rmtree(folder)",
     [killed_saves]),
    ("a stopped save's .tmp kept", "machinery/checkpoints.py",
     'name.endswith((".deleting", ".tmp"))',
     'name.endswith(".deleting")',
     [killed_saves,
      "tests/test_checkpoints.py::test_stopped_saves_and_prunes_are_removed"]),
    ("a stopped prune's .deleting kept", "machinery/checkpoints.py",
     'name.endswith((".deleting", ".tmp"))',
     'name.endswith(".tmp")',
     [killed_saves,
      "tests/test_checkpoints.py::test_stopped_saves_and_prunes_are_removed"]),
    ("eval.py lists a stopped save", "eval.py", 're.fullmatch(r"step_(\\d+)"',
     're.match(r"step_(\\d+)"',
     [killed_saves]),
    ("paper rule case-sensitive", "verify.py", 'r"(?i)Answer\\s*:', 'r"Answer\\s*:',
     [paper_rule,
      guarantees + "test_a_lower_case_answer_line_is_rewarded_under_the_paper_rule"]),
    ("paper rule: no space before the colon", "verify.py", 'r"(?i)Answer\\s*:', 'r"(?i)Answer:',
     [paper_rule]),
    ("paper rule: the whole line, not after '='", "verify.py", 'answer = answer.split("=")[-1]',
     "answer = answer", [paper_rule]),
    ("paper rule: a box left closed", "verify.py",
     'answer = re.sub(r"(\\\\boxed\\{)(.*)(\\})", "\\\\2", answer)', "answer = answer",
     [paper_rule]),
    ("paper rule: no $...$ span", "verify.py",
     'answer = re.sub(r"(.*?)(\\$)(.*?)(\\$)(.*)", "$\\\\3$", answer)', "answer = answer",
     [paper_rule]),
    ("paper rule: the gold not normalised", "verify.py", "== _dapo_normalize(gold)", "== gold",
     [paper_rule]),
    # the lockstep, the bf16 reduce, the update's T, the push and its guard
    ("a short rank repeats its last micro-batch", "machinery/planner.py",
     "dealt[run] = mine + [[idle]] * (max(map(len, plan)) - len(mine))",
     "dealt[run] = mine + [mine[-1] if mine else [idle]] * (max(map(len, plan)) - len(mine))",
     [uneven_lockstep]),
    ("idle passes counted in the metrics", "rlep.py",
     'if micro["samples"][0] is not idle:', "if True:",
     [uneven_lockstep]),
    ("shared groups planned at position % W", "machinery/planner.py",
     "d.rank) for position, group in my_groups.items()]",
     "position % d.world_size) for position, group in my_groups.items()]", [uneven_lockstep]),
    ("bf16 runs reduce gradients in bf16", "machinery/fsdp.py", "reduce_dtype=torch.float32,",
     "reduce_dtype=torch.bfloat16,", [bf16_update]),
    ("bf16 runs gather fp32 weights", "machinery/fsdp.py",
     "    if gather_bf16:\n", "    if False:\n", [bf16_update]),
    ("build_policy never asks for bf16 gathers", "rlep.py", 'gather_bf16=cfg.dtype == "bfloat16")',
     "gather_bf16=False)", [bf16_update]),
    ("the update's log-probs at T 1", "rlep.py",
     "policy = TokenLogProbs(model, cfg.temperature)",
     "policy = TokenLogProbs(model, 1.0)",
     [sync + "test_the_update_takes_pi_old_at_the_runs_temperature"]),
    ("the policy built in eval mode", "machinery/fsdp.py", "    model.train()\n", "",
     [checkpointing]),
    ("build_policy ignores --gradient_checkpointing", "rlep.py",
     "model = fsdp.load_model(path, d, cfg.gradient_checkpointing)",
     "model = fsdp.load_model(path, d, False)", [checkpointing]),
    ("later epochs in the first one's order", "rlep.py",
     "runs = plan_mini_batches(len(sizes), num_updates, epoch, seed_for(seed, epoch))",
     "runs = plan_mini_batches(len(sizes), num_updates, 0, seed_for(seed, epoch))",
     [epoch_orders]),
    ("every later epoch in one order", "rlep.py",
     "runs = plan_mini_batches(len(sizes), num_updates, epoch, seed_for(seed, epoch))",
     "runs = plan_mini_batches(len(sizes), num_updates, epoch, seed)", [epoch_orders]),
    ("a push keeps the prompt blocks cached under the old weights", "machinery/vllm_engine.py",
     "        self.llm.reset_prefix_cache()", "        pass",
     [sync + "test_a_push_drops_the_prompt_blocks_cached_under_the_old_weights"]),
    ("push guard: up_proj recorded under its own name", "machinery/vllm_engine.py",
     'r"\\.(gate|up)_proj\\."', 'r"\\.(gate)_proj\\."',
     [sync + "test_every_weight_a_push_records_is_an_engine_parameter"]),
    ("push guard: v_proj recorded under its own name", "machinery/vllm_engine.py",
     'r"\\.[qkv]_proj\\."', 'r"\\.[qk]_proj\\."',
     [sync + "test_every_weight_a_push_records_is_an_engine_parameter", stale_part]),
    ("push guard within 1 %", "machinery/vllm_engine.py", "rel_tol=1e-9, abs_tol=1e-12",
     "rel_tol=1e-2, abs_tol=1e-12", [stale_part]),
    ("push guard's sum drops a chunk's last element", "machinery/vllm_engine.py",
     "part.sum(dtype=torch.float64)", "part[:-1].sum(dtype=torch.float64)",
     [sync + "test_float64_sum_adds_every_chunk"]),
    # the planner, the exchange, the ranks' choice, the resume comparison, the FSDP setup
    ("a micro-batch row past the token budget", "machinery/planner.py",
     "fits = [max(1, max_tokens // length) if max_tokens",
     "fits = [max(1, max_tokens // length) + 1 if max_tokens", [planner]),
    ("fewer micro-batches than the rows need", "machinery/planner.py",
     "max(count, needs[0])", "(count or needs[0])", [planner]),
    ("micro-batches not heaviest first", "machinery/planner.py",
     "micro_batches.sort(key=lambda run: -len(run) * max(row_lengths[i] for i in run))", "pass",
     [planner]),
    ("rows unsorted under a token budget", "machinery/planner.py",
     "order.sort(key=lambda i: -row_lengths[i])", "pass", [planner]),
    ("micro-batches dealt in blocks, not in turn", "machinery/planner.py",
     "return [micro_batches[rank::world_size] for rank in range(world_size)]",
     "return [micro_batches[rank * passes:(rank + 1) * passes] for rank in range(world_size)]",
     [planner]),
    ("the exchange lets a plain tensor through", "machinery/ranks.py",
     "if isinstance(obj, torch.Tensor):", "if isinstance(obj, torch.nn.Parameter):",
     [tensor_row]),
    ("dynamic sampling: the choice returned trues first", "rlep.py",
     "    return sorted(chosen)\n", "    return chosen\n", ["tests/test_dynamic_sampling.py"]),
    ("dynamic sampling: the latest dropped groups fill", "rlep.py",
     "chosen += [key for key, flag in ordered if not flag][:count - len(chosen)]",
     "chosen += [key for key, flag in ordered if not flag][::-1][:count - len(chosen)]",
     ["tests/test_dynamic_sampling.py"]),
    ("resume: --lr free to change", "machinery/preflight.py",
     '"gpu_memory_utilization", "wandb_project"}',
     '"gpu_memory_utilization", "wandb_project", "lr"}', refusals),
    ("resume: dtype auto compared", "machinery/preflight.py",
     '\n               and not (name == "dtype" and now[name] == "auto")]', "]", [resume_fields]),
    ("resume: a lacking field not recorded", "machinery/preflight.py",
     "for name in compared if name in changed or name in lacking]",
     "for name in compared if name in changed]", [resume_fields]),
    ("resume: a fresh run's empty config compared", "machinery/preflight.py",
     "lacking = [name for name in compared if saved and name not in saved]",
     "lacking = [name for name in compared if name not in saved]", refusals),
    ("FSDP: rank 0's buffers not broadcast", "machinery/fsdp.py",
     "        dist.broadcast(buffer, src=0)", "        pass",
     ["tests/test_update.py", "tests/test_load.py"]),
    ("FSDP: the decoder layers not units of their own", "machinery/fsdp.py",
     "for unit in [*model.model.layers, policy]:", "for unit in [policy]:",
     ["tests/test_load.py::test_rank_zero_alone_reads_the_weights_and_every_rank_gets_them"]),
    # --dynamic_sampling (a control)
    ("dynamic sampling: replays not counted in a group's variance", "rlep.py",
     "return len({s.correct for s in group}) > 1  # control",
     "return len({s.correct for s in group if not s.replay}) > 1  # control",
     [dynamic + "test_a_group_is_dropped_when_its_answers_all_agree_replays_included",
      dynamic + "test_replays_rescue_a_group_whose_fresh_rollouts_all_fail"]),
    ("dynamic sampling: a capped step not filled", "rlep.py",
     "chosen += [key for key, flag in ordered if not flag][:count - len(chosen)]",
     "chosen += []",
     [dynamic + "test_the_first_mixed_groups_in_stream_order_are_kept_and_dropped_ones_fill_a_"
      "short_step", dynamic + "test_at_the_cap_the_dropped_groups_fill_the_step_earliest_first"]),
    ("dynamic sampling: chosen in the order the ranks report in", "rlep.py",
     "    ordered = sorted(flags)", "    ordered = flags",
     [dynamic + "test_the_choice_takes_stream_order_not_the_order_the_ranks_report_in",
      dynamic + "test_two_ranks_keep_the_same_groups_in_the_same_places_as_one_where_the_choice_"
      "binds"]),
    ("dynamic sampling: a later round reuses round 0's keys", "rlep.py",
     "extra = (j,) if j else ()  # control", "extra = ()  # control",
     [dynamic + "test_the_step_is_refilled_from_the_next_rounds_in_their_order"]),
    ("dynamic sampling: the next step one round on", "rlep.py",
     'prompt_round += meter["gen_rounds"]', "prompt_round += 1",
     [dynamic + "test_a_dynamic_run_logs_what_it_generated"]),
    ("dynamic sampling: a resume at the step's round", "machinery/checkpoints.py",
     'return step, folder, state.get("prompt_round", step)', "return step, folder, step",
     [dynamic + "test_a_resumed_dynamic_run_starts_at_the_round_the_uninterrupted_one_did"]),
    # eval.py
    ("eval: benchmarks not split by source", "eval.py",
     'benchmarks[name] = [row for row in rows if row.get("data_source") == source]',
     "benchmarks[name] = rows",
     [guarantees + "test_a_file_of_several_sources_is_a_benchmark_each_with_its_own_rows"]),
    ("eval: k = 16", "eval.py", 'default=32, help="samples per problem"',
     'default=16, help="samples per problem"', [eval_protocol]),
    ("eval: temperature 0.6", "eval.py",
     'parser.add_argument("--temperature", type=float, default=1.0)',
     'parser.add_argument("--temperature", type=float, default=0.6)',
     [eval_protocol]),
    ("eval: 4096 new tokens", "eval.py", "default=3072,", "default=4096,",
     [eval_protocol]),
    ("eval: the paper's column graded by equivalence", "eval.py",
     'verify.verify(t, record["gold"], mode="dapo")', 'verify.verify(t, record["gold"])',
     [both_rules]),
    ("eval: avg@k as pass@k", "eval.py",
     'metrics[rule] = {f"avg@{n}": float(np.mean([c for v in verdicts for c in v]))}',
     'metrics[rule] = {f"avg@{n}": float(np.mean([any(v) for v in verdicts]))}',
     [both_rules]),
]

# Edits a search tried that no test can kill, because none changes what a run computes (why, for
# each); `--equivalent` runs them, and each is expected to survive its tests.
equivalent = [
    ("deal plans epoch 1's order", "rlep.py",
     "plan_mini_batches(len(sizes), num_updates, 0, 0),",
     "plan_mini_batches(len(sizes), num_updates, 1, 0),",
     [planner, "tests/test_update.py"],
     "the same runs in another order: every rank sends and receives the same rows, in another "
     "order of a dict that nothing reads in order"),
    ("rank 0's gather in reverse rank order", "machinery/ranks.py",
     "    return [x for part in gathered or [] for x in part]",
     "    return [x for part in (gathered or [])[::-1] for x in part]",
     ["tests/test_dynamic_sampling.py"],
     "its one caller, sample_and_grade, sorts the records by row order (ids are unique)"),
    ("FSDP2 casts the forward's inputs", "machinery/fsdp.py", "cast_forward_inputs=False)",
     "cast_forward_inputs=True)", ["tests/test_update.py", "tests/test_load.py"],
     "it casts floating tensors, into a copy of the arguments; the forward reads token ids, "
     "positions and the mask (integers, booleans) and only the shape of completion_mask"),
    ("the model's KV cache left on in training", "machinery/fsdp.py",
     "    model.config.use_cache = False\n", "", ["tests/test_update.py", "tests/test_load.py"],
     "the logits are the same; the cache holds the keys and values autograd keeps for the "
     "backward anyway, and transformers turns it off under gradient checkpointing"),
]


def tests_of(mutation) -> list[str]:
    return list(mutation[4]) if len(mutation) > 4 else fast_tests


def edits(mutation) -> list[tuple[str, str]]:
    """A mutation's (pattern, replacement) pairs."""
    pattern, replacement = mutation[2], mutation[3]
    if isinstance(pattern, str):
        return [(pattern, replacement)]
    return list(zip(pattern, replacement, strict=True))


def seen_by(source: str, pattern: str) -> list[str]:
    """The names a test that can see an edit of `pattern` in `source` mentions: the innermost
    function holding it; outside any, the names in the pattern."""
    line = source[:source.index(pattern)].count("\n") + 1
    holders = [node for node in ast.walk(ast.parse(source))
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
               and node.lineno <= line <= node.end_lineno]
    if holders:
        return [max(holders, key=lambda node: node.lineno).name]
    return [word for word in re.findall(r"[A-Za-z_]\w{3,}", pattern)
            if not keyword.iskeyword(word)]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """As pytest's plugin (-p mutate): the tests whose code names one of MUTATE_SEES first,
    then the others; the quick tier's first within each; otherwise in the order given."""
    names = [name for name in os.environ.get("MUTATE_SEES", "").split(",") if name]
    mentions = re.compile(r"\b(%s)\b" % "|".join(map(re.escape, names))) if names else None

    def sees(item):
        try:
            return bool(mentions and mentions.search(inspect.getsource(item.function)))
        except (AttributeError, OSError, TypeError):
            return False
    items.sort(key=lambda item: (not sees(item), item.get_closest_marker("quick") is None))


def run_tests(copy: str, tests: list[str], sees: list[str] = ()) -> int:
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p",
               "mutate", *tests]
    path = os.pathsep.join([os.path.join(copy, "tools"), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "MUTATE_SEES": ",".join(sees)}
    return subprocess.run(command, cwd=copy, stdout=subprocess.DEVNULL, env=env,
                          stderr=subprocess.DEVNULL, timeout=1800).returncode


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help="mutations to run (default: all)")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--equivalent", action="store_true",
                        help="run the equivalent edits instead: each should survive")
    args = parser.parse_args()
    listed = equivalent if args.equivalent else mutations
    chosen = [m for m in listed if not args.names or m[0] in args.names]
    unknown = set(args.names) - {m[0] for m in listed}
    if args.list or unknown:
        print("\n".join(m[0] for m in listed))
        sys.exit(f"unknown mutations: {sorted(unknown)}" if unknown else 0)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rlep-mutate-") as tmp:
        copy = os.path.join(tmp, "repo")
        shutil.copytree(repo, copy, ignore=shutil.ignore_patterns(
            ".git", ".venv", ".cache", "runs", "__pycache__", ".pytest_cache"))
        # the tests of the chosen mutations, each once
        baseline = list(dict.fromkeys(t for m in chosen for t in tests_of(m)))
        if run_tests(copy, baseline) != 0:
            sys.exit("the unmutated copy fails the tests: fix them first")
        print(f"unmutated: the tests pass ({time.perf_counter() - started:.0f} s)", flush=True)
        killed = 0
        for mutation in chosen:
            name, file = mutation[:2]
            path = os.path.join(copy, file)
            original = open(path, encoding="utf-8").read()
            counts = [original.count(pattern) for pattern, _ in edits(mutation)]
            if counts != [1] * len(counts):
                print(f"STALE     {name}: the pattern occurs {counts} times in {file}",
                      flush=True)
                continue
            mutated = original
            sees = []
            for pattern, replacement in edits(mutation):
                sees += seen_by(original, pattern)
                mutated = mutated.replace(pattern, replacement)
            start = time.perf_counter()
            with open(path, "w", encoding="utf-8") as f:
                f.write(mutated)
            try:
                status = run_tests(copy, tests_of(mutation), sees)
            finally:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(original)
            seconds = time.perf_counter() - start
            # 1: a test failed; anything else (an error, a crash) is not a clean kill
            verdict = {0: "SURVIVED", 1: "killed"}.get(status, f"ERROR rc={status}")
            killed += status == 1
            print(f"{verdict:9s} {name} ({seconds:.0f} s)", flush=True)
    print(f"{killed}/{len(chosen)} mutations killed in {time.perf_counter() - started:.0f} s")
    if args.equivalent:
        for m in chosen:
            print(f"equivalent: {m[0]}: {m[5]}")
        sys.exit(0 if killed == 0 else 1)
    sys.exit(0 if killed == len(chosen) else 1)


if __name__ == "__main__":
    main()
