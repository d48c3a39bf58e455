"""The lowest layer: the small mechanisms every other package needs, each written once.

Standard library only, and nothing of ours outside this folder (``tests/ci/test_one_home.py`` keeps both), so
any package (``sources/`` before dependencies are installed, the checks, the weights tools) may use it:

* `atomic_write`: files written beside their target and renamed into place, durably, honouring the umask;
* `regular_file`: a small input file read with a size bound, never blocking on a FIFO;
* `env_flags`: one grammar for boolean switches in the environment, and typed getters for numbers and lists;
* `env_registry`: every environment variable the project reads (parser, default, owners, doc), the getters the
  code reads them with, and the documentation's table of them (docs/environment.md);
* `host_device`: which device this host has (npu | cuda | cpu), with its one override variable;
* `strict_int`: integers typed by a user or read from a file, ASCII digits only.
* `node_ip`: this node's addresses, from the kernel (no `ifconfig`, no probe to an outside address).
* `config_access`: a composed config read by dotted key, a missing level giving the default.
* `rank_exit`: how a worker process (a rank) ends once its result is written, skipping interpreter teardown.
* `free_port`: a TCP port for a rendezvous or a test's server, asked for on 127.0.0.1 only; whether a fixed
  port is free to bind; a block of fixed ports outside the kernel's ephemeral range.
* `cpu_numerics`: the variables that hold the CPU proof's floats to one code path (ATen AVX2, MKL COMPATIBLE,
  one thread).
"""
