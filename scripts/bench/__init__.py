"""Speed benchmarks as a library: each returns a report object the scripts print and the tests
read (`scripts/bench_*.py` are thin command lines over these).

    train_levers     a recipe's CPU levers on its own packs, interleaved (what CPU recipes use)
    eval_paths       `fincheck eval` naive, batched and with prefix reuse, on the same examples
    workload         random-init models of real architectures, prepared lengths, device, date
    options          command-line options generated from a settings dataclass

Benchmarks whose decision is made are archived: their commands and figures stay in
docs/performance.md, their code in the history (see "Archived benchmarks" there).
"""
