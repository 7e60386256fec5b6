"""fincheck's detector as a metric of the RAG evaluators users run: DeepEval
(`deepeval_metric.FincheckMetric`, a `BaseMetric`) and Ragas (`ragas_metric.FincheckSupport`,
a single-turn metric). Both score an answer against its retrieved context with FINAL's reading
(`support.judge_support`): the score is the probability that the answer holds nothing the
context does not support (1 - `fincheck detect`'s flag score), the reason the description list.
Each runs on an adapter loaded here or on a served export (`fincheck.detector.Detector`).

Optional: `pip install 'fincheck[rag]'`. Each module imports its own library only.
"""
