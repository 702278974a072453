"""``cachepipe drop SRC --cache-dir DIR``: free the cache of older versions of a source.

Drops the namespaces of SRC's older fingerprints (NOTE [stale namespaces] in
``cachepipe/stale.py``): their L2 keys on every shard and their directory in the cache
dir. ``--fingerprint FP`` drops exactly the ones named (also one with no manifest here,
as ``cachepipe stats`` lists them); the current fingerprint is never dropped, nor another
source's namespace. Everything is checked before anything is deleted.

Exit status: 0 (also when there is nothing to drop), 2 bad flag values (a malformed
fingerprint, the current one, another source's), 3 missing or invalid source, 4 L2
unreachable or refusing a command, 5 a namespace in use by a running process of this node
(NOTE [namespace lease]), 6 a cache dir entry that cannot be removed (read-only, a link).
"""
from __future__ import annotations

import argparse
import json
import sys

__all__ = ["configure", "main"]


def configure(parser: argparse.ArgumentParser) -> None:
    from tools.cache_flags import add_cache_arguments
    from tools.writable import add_json_flag

    add_cache_arguments(parser)
    parser.add_argument("--fingerprint", action="append", default=None, metavar="FP",
                        help="drop this fingerprint's namespace (repeat for several); default: every older "
                             "version of SRC with a manifest in --cache-dir")
    parser.add_argument("--dry-run", action="store_true", help="say what would be dropped, drop nothing")
    add_json_flag(parser, "the result", to_file=False)


def _fail(message: str, code: int) -> int:
    print(f"cachepipe drop: error: {message}", file=sys.stderr)
    return code


def main(args: argparse.Namespace) -> int:
    from cachepipe.errors import L2UnavailableError
    from cachepipe.lease import NamespaceInUseError
    from cachepipe.stale import NamespaceError, drop
    from tools.cache_flags import cache_from_args, check_args

    try:
        check_args(args)
    except ValueError as exc:
        return _fail(str(exc), 2)
    try:
        cache = cache_from_args(args, 256, save_manifest=False)  # every size is dropped; writes nothing
    except (FileNotFoundError, ValueError) as exc:
        return _fail(str(exc), 3)
    try:
        with cache:
            result = drop(cache, args.fingerprint, dry_run=args.dry_run)
    except ValueError as exc:
        return _fail(str(exc), 2)
    except L2UnavailableError as exc:
        return _fail(str(exc), 4)
    except NamespaceInUseError as exc:
        return _fail(str(exc), 5)
    except OSError as exc:  # NamespaceError, or a cache dir that cannot be read
        return _fail(str(exc) if isinstance(exc, NamespaceError) else f"{args.cache_dir}: {exc.strerror or exc}", 6)
    if args.json:
        print(json.dumps(result, indent=1))
    elif not result["fingerprints"]:
        print(f"drop: nothing to drop: no older version of {cache.manifest.root} in {args.cache_dir} "
              f"(current fingerprint {cache.fingerprint})")
    else:
        verb = "would drop" if args.dry_run else "dropped"
        print(f"drop: {verb} {len(result['fingerprints'])} namespace(s) ({', '.join(result['fingerprints'])}): "
              f"{result['l2_keys']} L2 keys, {len(result['dirs'])} cache dir entr"
              f"{'y' if len(result['dirs']) == 1 else 'ies'}; kept {cache.fingerprint}")
    return 0
