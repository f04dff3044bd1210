"""The servers a worker drives, in one place: what kind each is and whether it may be used
(`preflight`), whether it is up (`health`, the gate), which model it serves (`model_check`),
which campaigns go to it (`routing`), the HTTP client for its probes (`client`), how any request
to it fails and carries the API key (`transport`), and the per-process state the health gate and
the batch threads share (`fleet`). What differs between SGLang and vLLM is in workers/backends/.
"""
