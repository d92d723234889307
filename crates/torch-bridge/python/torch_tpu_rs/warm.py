"""Compiles the programs a run recorded into the compile cache, several at
once, without running the model.

A run records the programs it builds with ``TPU_RS_RECORD_PROGRAMS``::

    TPU_RS_RECORD_PROGRAMS=programs.txt python train.py

and this compiles them into the cache folder (``TPU_RS_CACHE_DIR``) of the
host it runs on, e.g. on each host of a job before it starts, or after a
plugin upgrade invalidated the folder's executables::

    python -m torch_tpu_rs.warm programs.txt [--threads N]
"""

import argparse
import sys

from . import _C


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m torch_tpu_rs.warm", description=__doc__.split("\n\n")[0])
    parser.add_argument("record", help="the file a run wrote with TPU_RS_RECORD_PROGRAMS")
    parser.add_argument("--threads", type=int, default=0, help="compiles at once (default: one per core)")
    args = parser.parse_args(argv)
    programs, compiled, cached, failed, seconds = _C.warm_cache(args.record, args.threads)
    print(f"{programs} programs: {compiled} compiled, {cached} already cached, {len(failed)} failed in {seconds:.2f} s")
    for error in failed:
        print(f"  failed: {error}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
