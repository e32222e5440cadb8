"""The benchmark's rows as text: the timing table with its notes (what each batch held among
them), and the compiled-memory table.

The rows are those `bertjax.tools.bench.run` returns (its docstring lists their fields).
"""
from __future__ import annotations

from typing import Any, Sequence

from bertjax.tools.bench_peers import PEERS

HF_LOGITS_NOTE = ("HF (torch and Flax) computes MLM logits at every position; bertjax gathers the "
                  "masked ones first (as original BERT). model_flops counts the gathered "
                  "positions for every peer.")


def rows_line(r: dict[str, Any]) -> str:
  """One line on what a row's batch held: real or synthetic rows, packing, fill."""
  where = (f"real rows of the bundled corpus ({r['rows_source']})" if r["rows"] == "real"
           else "synthetic rows (random, every token real)")
  packed = f"up to {r['packing']} sequences a row" if r["packing"] else "one sequence a row"
  return (f"{r['size']}: {where}, {packed}: {r['sequences']} sequences, {r['tokens']} real "
          f"tokens, fill {100 * r['fill']:.1f}% (real tokens / slots), {r['predictions']} "
          f"predictions in {r['prediction_slots']} slots a row.")


def format_memory_table(rows: Sequence[dict[str, Any]]) -> str:
  """The compiled memory per device of bertjax rows (--memory_only) as a text table."""
  hbm = any(r.get("hbm_bytes") for r in rows)
  header = (f"{'size':<7} {'dtype':<9} {'batch':>5} {'seq':>5} {'attention':<10} {'remat':<6} "
            f"{'optimizer':<9} {'args GiB':>9} {'temp GiB':>9} {'total GiB':>10} "
            f"{'activations GiB':>16} {'of which seq x seq':>19}"
            + (f" {'of HBM':>7}" if hbm else ""))
  lines = [header, "-" * len(header)]
  for r in rows:
    m = {k: v / 2**30 for k, v in r["compiled_memory"].items()}
    share = (f" {r['compiled_memory']['total'] / r['hbm_bytes']:>7.0%}" if r.get("hbm_bytes")
             else " " * 8 if hbm else "")
    lines.append(f"{r['size']:<7} {r['dtype']:<9} {r['batch_size']:>5} {r['seq_len']:>5} "
                 f"{r['attention']:<10} {r['remat']:<6} {r['optimizer']:<9} "
                 f"{m['arguments']:>9.2f} {m['temporaries']:>9.2f} {m['total']:>10.2f} "
                 f"{m['activations']:>16.2f} {m['attention_matrices']:>19.2f}" + share)
  if rows:
    r = rows[0]
    where = r["platform"]
    if r.get("devices", 1) > 1:
      where = f"{r['devices']} x {r['device']} (batch {r['batch_size']} split over them)"
    if r.get("hbm_bytes"):
      where += f", {r['hbm_bytes'] / 2**30:.0f} GiB of HBM a chip"
    lines.append(f"per device, as XLA compiled the train step for {where} (arguments: "
                 "parameters, optimizer state and batch; total = arguments + outputs - donated "
                 "+ temporaries); activations: what the backward pass keeps from the forward "
                 "(jax.vjp's residuals, a device's share of the rows), which remat trades for "
                 "recomputation; of which seq x seq: the attention matrices among them, which a "
                 "fused kernel (cuDNN, splash) does not keep.")
  else:
    lines.append("")
  lines.extend(rows_line(r) for r in {(r["size"], r["rows_source"]): r for r in rows}.values())
  return "\n".join(lines)


def format_table(rows: Sequence[dict[str, Any]]) -> str:
  """The rows as a fixed-width text table, then the notes.

  The ratio columns (`jax/torch`, `jax/hf_flax`: bertjax tokens/s over the peer's) are those of
  the peers present, on the bertjax rows.
  """
  others = [p for p in PEERS if p != "bertjax" and any(r["peer"] == p for r in rows)]
  header = (f"{'size':<7} {'peer':<8} {'device':<22} {'dtype':<9} {'step ms':>9} "
            f"{'tokens/s':>11} {'ex/s':>9} {'peak MiB':>9} {'GFLOP/step':>11} {'MFU':>7}"
            + "".join(f" {'jax/' + p:>11}" for p in others))
  lines = [header, "-" * len(header)]
  for r in rows:
    if r["step_ms"] is None:  # --memory_only: see format_memory_table
      continue
    mfu = "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
    ratios = [f"{r[f'speedup_vs_{p}']:.2f}x" if f"speedup_vs_{p}" in r else "" for p in others]
    lines.append(
        f"{r['size']:<7} {r['peer']:<8} {r['device'][:22]:<22} {r['dtype']:<9} "
        f"{r['step_ms']:>9.2f} {r['tokens_per_s']:>11.0f} {r['examples_per_s']:>9.1f} "
        f"{r['peak_memory_bytes'] / 2**20:>9.1f} {r['model_flops'] / 1e9:>11.3f} {mfu:>7}"
        + "".join(f" {ratio:>11}" for ratio in ratios))
  if rows:
    r = rows[0]
    lines.append(f"batch {r['batch_size']} x seq {r['seq_len']}, {r['max_predictions']} "
                 f"predictions/sequence at most; step ms: {r['steps']} steps run back to back, "
                 "blocked once at the end; tokens/s and GFLOP/step count real tokens and "
                 "prediction slots.")
  for r in {(r["size"], r["rows_source"]): r for r in rows}.values():
    lines.append(rows_line(r))
  for r in rows:
    if "compiled_memory" in r and r["step_ms"] is not None:
      lines.append(f"bertjax {r['size']}: {r['recipe']} recipe, attention {r['attention']}, "
                   f"packing {r['packing']}, remat {r['remat']}, {r['optimizer']}, {r['prng']}; "
                   f"compiled memory per device {r['compiled_memory']['total'] / 2**30:.2f} "
                   "GiB; compiled in "
                   f"{r['step_compile_s']:.1f} s (step), {r['init_compile_s']:.1f} s (init).")
  lines.append(HF_LOGITS_NOTE)
  if len({r["platform"] for r in rows}) > 1:
    lines.append("WARNING: the peers ran on different platforms; the ratio compares devices.")
  return "\n".join(lines)
