"""`scalestudy prepare-data`: download (cifar10, mnist) or generate (synthetic) a dataset ONCE.

Writes `DIR/<dataset>/data.pt` (uint8 images, int64 labels) and then `DIR/<dataset>/meta.json`
(written last: its presence marks a complete, checksummed preparation). Training never
downloads: it reads the result with loaders.load_prepared.
"""

from __future__ import annotations

import argparse
import errno
import gzip
import hashlib
import http.client
import json
import math
import os
import pickle
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from scalestudy import files, log, vocab
from scalestudy.errors import ChecksumError, DownloadError, PreparedDataError
from scalestudy.files import atomic_open, write_json
from scalestudy.trainer.loaders import CROP_PAD, FORMAT_VERSION, derive_seed, load_prepared

logger = log.get(__name__)

DATASETS = tuple(vocab.DATASETS)


# Official archives and the md5s torchvision checks (module-level so tests can substitute them).
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/"
CIFAR10_FILES = {"cifar-10-python.tar.gz": "c58f30108f718f92721af3b95e74349a"}
MNIST_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "http://yann.lecun.com/exdb/mnist/",
)
MNIST_FILES = {
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}
# A connection that sends nothing for this long has stalled (a mirror that hangs, a connection a
# firewall dropped). Per connect and per read, not for the whole download.
DOWNLOAD_STALL_S = 60.0
_DIGITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
MNIST_CLASSES = [f"{i} - {w}" for i, w in enumerate(_DIGITS)]  # torchvision's names
SYNTHETIC_DEFAULTS = {
    "num_train": vocab.DATASETS["synthetic"].train,
    "num_test": vocab.DATASETS["synthetic"].test,
    "seed": 0,
}

# ---------------------------------------------------------------------------------------------
# Download and conversion of the real datasets
# ---------------------------------------------------------------------------------------------


def _download(base_url: str, filename: str, md5: str, raw_dir: Path) -> str:
    """base_url+filename as raw_dir/filename (skipped when a file with the right md5 is there);
    returns where it came from, for meta.json's source: the URL it was read from (where a
    redirect led), without its query (_without_query), or the absolute path of the file that
    was there (the mirror was not asked).

    What arrives goes through a temp file beside it (_save): a transfer that stalled or broke
    off, or a file with another md5, never takes the archive's name nor replaces what is there.
    An https transfer that fails is tried once more over http, as torchvision's download did
    (not a URL with a query: a signed URL's token would go in clear text; nor after the server
    answered over https, a 404 say); when that fails too, the error names both causes, https's
    first."""
    url = _url(base_url, filename)
    path = raw_dir / filename
    try:
        there = path.is_file() and _md5(path) == md5
    except OSError as e:  # a read error (EIO) names no file, which cli.main takes for a bug
        fix = "remove it (it is downloaded again)" if e.errno in _NO_PERMISSION else ""
        raise PreparedDataError(
            f"cannot read {path}, the archive raw/ holds: {e.strerror or e}; "
            f"{fix or _failing(raw_dir)} or give another --data-dir"
        ) from e
    if there:
        logger.info(f"prepare-data: {path} is there with the right md5; not downloaded again")
        return os.path.abspath(path)
    _make_dir(raw_dir)
    if url.startswith("file://"):  # torchvision's download_url failed on file:// (a traceback)
        _copy_local(url, path, md5)
        return _without_query(url)
    try:
        return _without_query(_fetch(url, path, md5))
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        why = f"could not download {_shown(url)} to {path}: {_why(e)}"
        # an https server that answered, or a URL that was never sent: no retry over http
        answered = isinstance(e, urllib.error.HTTPError | http.client.InvalidURL)
        if not url.startswith("https://") or answered:
            # an https server that answered (404, 403) was asked again in clear text, which can
            # only fail or reach someone else: the retry is for a TLS or proxy failure
            raise DownloadError(f"{why}. {_offline(md5, path)}") from e
        if urllib.parse.urlsplit(url).query:
            # a signed URL's token, retried over http, went in clear text to whatever is on the
            # path (the proxy or TLS interceptor that failed https among them)
            raise DownloadError(
                f"{why}; not retried over http: its query may hold a secret, which http sends "
                f"in clear text. {_offline(md5, path)}"
            ) from e
        # torchvision's retry over http showed the retry's error alone: "connection refused"
        # on port 80 for what was a TLS, proxy or stalled https transfer
        plain = "http://" + url.removeprefix("https://")
        try:
            came_from = _fetch(plain, path, md5)
        except (urllib.error.URLError, OSError, http.client.HTTPException) as again:
            raise DownloadError(
                f"{why}; nor over http ({plain}): {_why(again)}. {_offline(md5, path)}"
            ) from again
        logger.warning(
            f"prepare-data: {_shown(url)} failed ({_why(e)}); downloaded over http instead"
        )
        return _without_query(came_from)


def _url(base_url: str, filename: str) -> str:
    """`filename` under the mirror `base_url`: joined to its path, its query kept. Appended to
    the URL's text, a signed URL's https://host/dir/?token=abc asked for
    dir/?token=abc/<file>, the name read as part of the token (prepare refuses a fragment)."""
    parts = urllib.parse.urlsplit(base_url)
    return parts._replace(path=parts.path.rstrip("/") + "/" + filename).geturl()


def _without_query(url: str) -> str:
    """`url` as meta.json's source records it: without its query. A mirror's query may hold a
    secret (a signed URL's token, an S3 X-Amz-Signature; a redirect may add one), and meta.json
    travels with the prepared data (copied to other machines, archived, shared); its scheme,
    host and path still name the server and the file."""
    return urllib.parse.urlsplit(url)._replace(query="", fragment="").geturl()


def _shown(url: str) -> str:
    """`url` as an error line or a warning says it: its query, which may hold a secret
    (_without_query), as "?..."; the error lines land in the workflow's logs, kept and shared
    in bug reports, and an expired token's 403 printed the token."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # no URL ('http://[::1/'): its query cut by hand
        head, query, _ = url.partition("?")
        return head + ("?..." if query else "")
    return parts._replace(query="...").geturl() if parts.query else url


def _fetch(url: str, path: Path, md5: str) -> str:
    """GET url into `path` (_save), each connect and read given up after DOWNLOAD_STALL_S;
    returns the URL the bytes came from: urllib follows redirects, and meta.json's source
    named the URL asked for, not the server a moved site or a CDN sent them from."""
    # the User-Agent torchvision's download sent (a server may refuse urllib's own)
    request = urllib.request.Request(url, headers={"User-Agent": "pytorch/vision"})
    # urllib has no timeout of its own: a mirror that stalls, a connection a firewall dropped,
    # and prepare-data (a local rule of the study) waited forever
    with urllib.request.urlopen(request, timeout=DOWNLOAD_STALL_S) as response:
        received = 0

        def read(n: int) -> bytes:
            nonlocal received
            try:
                chunk = response.read(n)
            except http.client.IncompleteRead as e:
                # a chunked reply cut short: what this read had (partial) and, from the cause,
                # the part of the chunk it was in; IncompleteRead's own words counted one read
                # and said none of what a reply cut short of its Content-Length says
                inner = e.__cause__ if isinstance(e.__cause__, http.client.IncompleteRead) else None
                part = len(e.partial) + (len(inner.partial) if inner is not None else 0)
                raise CutShort(received + part, None) from e
            received += len(chunk)
            return chunk

        # the Content-Length (None for a chunked reply), read before the body is: http.client
        # counts it down as the body arrives
        _save(read, path, md5, _shown(url), size=getattr(response, "length", None))
        return response.geturl()


class CutShort(http.client.HTTPException):
    """A reply body that ended before its Content-Length: http.client's read(n) returns what
    came and raises nothing, so the part reached the md5 check and was called "not the official
    file (wrong --mirror?)". Also a chunked reply (size None, no length announced) that ended
    before its last chunk: http.client's IncompleteRead."""

    def __init__(self, received: int, size: int | None) -> None:
        told = ", not the reply's end" if size is None else ""  # no length: only that it broke
        of = "" if size is None else f" of {size:,}"
        super().__init__(f"{received:,}{of} bytes arrived{told}")
        self.received, self.size = received, size


def _save(
    read: Callable[[int], bytes], path: Path, md5: str, origin: str, size: int | None = None
) -> None:
    """Copy what `read` (a source's read method) returns to `path` through a temp file beside
    it (atomic_open), its length (`size`, where the source announced one: CutShort) and md5
    checked before the rename: a copy that breaks off (Ctrl-C too) or has another md5 leaves
    `path` as it was (a good archive there is never replaced by a bad one). Any error writing
    the file (a full disk, a read-only or failing one) is a PreparedDataError (_unwritten); the
    source's errors (the network's) pass on as they are."""
    digest = hashlib.md5(usedforsecurity=False)
    received = 0
    # whose an OSError is: the write's and the source's both may name no file (write(2)'s EIO
    # on the temp file, a socket's reset), so an unnamed EIO writing raw/ was a traceback
    # (file://) or "could not download" (http), blaming the network
    reading = False
    try:
        with atomic_open(path, "wb") as out:
            while True:
                reading = True
                chunk = read(1 << 20)
                reading = False
                if not chunk:
                    break
                digest.update(chunk)
                out.write(chunk)
                received += len(chunk)
            if size is not None and received < size:
                raise CutShort(received, size)
            if (actual := digest.hexdigest()) != md5:
                raise ChecksumError(
                    f"{origin}: md5 mismatch: expected {md5}, got {actual}; not the official "
                    f"file (wrong --mirror, or a truncated/altered download?); not kept as {path}"
                )
    except OSError as e:
        if reading:  # the source's
            raise
        raise _unwritten(f"cannot write {path}", e, path.parent) from e


def _make_dir(directory: Path) -> None:
    """mkdir -p of a directory under --data-dir, or one PreparedDataError judged where it would
    have been made: a file in the way, a symlink to something missing (scratch space purged
    under a linked data directory: mkdir said "File exists", read as a failing disk), else
    the write failure's cause (_unwritten)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        existing = files.nearest_existing(directory)
        what = f"cannot create {directory}"
        if existing.is_symlink() and not existing.exists():
            raise PreparedDataError(
                f"{what}: {existing} is a symlink to missing {os.path.realpath(existing)}: "
                "create that, remove the link, or give another --data-dir"
            ) from e
        if not existing.is_dir():  # a file where a directory goes (mkdir names the deepest)
            raise PreparedDataError(
                f"{what}: {existing} is in the way (a file, not a directory): remove it or give "
                "another --data-dir"
            ) from e
        raise _unwritten(what, e, existing) from e


def _unwritten(what: str, e: BaseException, directory: Path) -> PreparedDataError:
    """A failed write under --data-dir as one line: `what`, the cause (files.write_failure) and
    its own fix; "free space there" was the advice for a read-only or failing disk too."""
    if isinstance(e, IsADirectoryError | NotADirectoryError):
        # a path in the way (a directory where the file goes, or a file where a directory
        # goes): no disk fault; named as given, not as the temp file it was renamed from
        where = getattr(e, "filename2", None) or e.filename
        return PreparedDataError(f"{what}: {where} is in the way ({e.strerror}): remove it")
    cause = files.write_failure(e, directory)
    if cause.startswith("no space left"):
        fix = "free space there"
    elif cause.startswith("no permission"):  # EACCES, EPERM, EROFS (a read-only mount)
        fix = f"make {directory} writable"
    else:
        fix = _failing(directory)
    return PreparedDataError(f"{what}: {cause}; {fix} or give another --data-dir")


_NO_PERMISSION = (errno.EACCES, errno.EPERM)


def _failing(directory: Path) -> str:
    """What to do about an I/O error (EIO and the like: a dying disk, a dead network mount)."""
    return (
        f"check the file system of {directory} (the kernel log, dmesg, names a failing disk or "
        "mount)"
    )


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _why(e: BaseException) -> str:
    """A failed transfer's cause in words: a stall's "timed out", on its own, named neither
    the limit nor the cause."""
    if isinstance(e, TimeoutError) or isinstance(getattr(e, "reason", None), TimeoutError):
        return f"nothing received for {DOWNLOAD_STALL_S:g} s (the server or the network stalled)"
    if isinstance(e, CutShort):
        return (
            f"the transfer was cut short: {e} (the server or the network ended it early); run "
            "prepare-data again, or give another --mirror"
        )
    if isinstance(e, http.client.InvalidURL):
        # its text holds the URL's path and query (a signed URL's token), and it was never sent
        return (
            "not a valid URL (write a space as %20, no control characters; a port is a "
            "number): fix --mirror"
        )
    if isinstance(e, http.client.HTTPException):
        # http.client's own errors, neither URLError nor OSError: a transfer that broke off
        # mid-body (a chunked reply: IncompleteRead), a server that speaks no HTTP
        return f"{e!r} (the transfer broke off, or the server is no HTTP server)"
    return " ".join(str(e).split())  # one line: a redirect loop's HTTPError text has three


def _offline(md5: str, path: Path) -> str:
    """The advice that ends a failed download's message (once, however many mirrors failed),
    with the size and md5 of a file already at `path` (an archive copied by hand, cut short):
    without them the advice read as if none were there."""
    try:
        there = f"; the one there, {path.stat().st_size:,} bytes, has md5 {_md5(path)}"
        if path.is_symlink():
            there += f" (a link to {os.path.realpath(path)})"
    except OSError:
        there = ""
    return (
        f"Without internet, place the file there yourself (md5 {md5}{there}) or pass --mirror URL."
    )


def _copy_local(url: str, path: Path, md5: str) -> None:
    """A --mirror file://DIR: copy DIR/<file> to `path` (_save: its md5 checked before the
    rename; it was copied over the archive there first, so a wrong DIR replaced a good one).
    A file that cannot be read is one line: the path, the cause, what --mirror file:// takes."""
    name = path.name
    fix = f"--mirror file:///DIR takes the absolute path of a directory with {name}, readable here"
    parsed = urllib.parse.urlparse(url)
    if parsed.netloc not in ("", "localhost"):
        # file://data/mirror: urlparse reads "data" as a host, and the file was looked for
        # in /mirror
        raise DownloadError(
            f"{_shown(url)} names the host {parsed.netloc!r} (a file:// URL's path starts after "
            f"its third slash); {fix}"
        )
    source = Path(urllib.request.url2pathname(parsed.path))

    def unreadable(e: OSError) -> DownloadError:
        return DownloadError(f"cannot read {source} (from {_shown(url)}): {e.strerror or e}; {fix}")

    # is_file() said "does not exist" of a directory, of an archive's path given for DIR (Not a
    # directory) and of a directory this user may not enter; and a read error (EIO) names no
    # file, which cli.main takes for a bug: a traceback. Only this file's open and reads are
    # "cannot read": _save's own write errors stay its own
    try:
        if source.exists() and not source.is_file() and not source.is_dir():
            raise OSError(errno.EINVAL, "not a regular file")  # a FIFO: open() would wait
        src = source.open("rb")
    except OSError as e:
        raise unreadable(e) from e

    def read(n: int) -> bytes:
        try:
            return src.read(n)
        except OSError as e:
            raise unreadable(e) from e

    with src:
        _save(read, path, md5, str(source))


def _download_any(mirrors: Sequence[str], filename: str, md5: str, raw_dir: Path) -> str:
    """Try each mirror in turn; returns the base the file came from (_download), without its
    query (_without_query): the mirror as given, raw_dir's absolute path and a slash for the
    file already there, the http URL an https mirror fell back to, where a redirect led (the
    whole URL where it named the file otherwise).
    When none works, one line (an expected error is one line) with each mirror's failure, then
    the advice once."""
    errors: list[DownloadError] = []
    for mirror in mirrors:
        try:
            origin = _download(mirror, filename, md5, raw_dir)  # without its query
            if origin == _without_query(_url(mirror, filename)):
                return _without_query(mirror)
            return origin.removesuffix(filename)
        except DownloadError as e:
            errors.append(e)
    if len(errors) == 1:
        raise errors[0]
    kind = ChecksumError if any(isinstance(e, ChecksumError) for e in errors) else DownloadError
    advice = f". {_offline(md5, raw_dir / filename)}"
    failures = "; ".join(str(e).removesuffix(advice) for e in errors)
    tail = advice if any(str(e).endswith(advice) for e in errors) else ""
    raise kind(f"every mirror failed: {failures}{tail}") from errors[-1]


def _extract(archive: Path, raw_dir: Path) -> None:
    """torchvision's extract_archive (a .tar.gz's members, a .gz's one file) into raw_dir. A
    failed write (the contents fill the disk the archive fit on) is one line: tarfile's and
    gzip's OSError names no file, which cli.main takes for a bug (a traceback)."""
    from torchvision.datasets.utils import extract_archive

    try:
        extract_archive(str(archive), str(raw_dir))
    except OSError as e:
        raise _unwritten(f"cannot extract {archive} into {raw_dir}", e, raw_dir) from e


def _unpickle(path: Path) -> dict:
    # CIFAR's batches are Python-2 pickles with bytes keys. pickle runs code, which is acceptable
    # here only because the archive they come from passed its md5 check.
    with open(path, "rb") as f:
        return pickle.load(f, encoding="bytes")


def convert_cifar10(raw_dir: str | Path) -> tuple[dict[str, torch.Tensor], list[str]]:
    """CIFAR-10 python batches -> ({train_x, train_y, test_x, test_y}, class names).

    raw_dir holds `data_batch_1..5`, `test_batch`, `batches.meta` (directly or in
    `cifar-10-batches-py/`). Each row of b"data" is 3072 bytes: 1024 R, then G, then B, each a
    row-major 32x32 plane, so reshape(N, 3, 32, 32) is already CHW.
    """
    root = Path(raw_dir)
    if (root / "cifar-10-batches-py").is_dir():
        root = root / "cifar-10-batches-py"

    def load(names: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        xs, ys = [], []
        for name in names:
            batch = _unpickle(root / name)
            data = np.asarray(batch[b"data"], dtype=np.uint8)
            labels = np.asarray(batch[b"labels"], dtype=np.int64)
            if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or len(labels) != len(data):
                raise ValueError(
                    f"{root / name}: expected data Nx3072 and N labels, got data {data.shape} "
                    f"and {len(labels)} labels"
                )
            xs.append(torch.from_numpy(data.reshape(-1, 3, 32, 32).copy()))
            ys.append(torch.from_numpy(labels.copy()))
        return torch.cat(xs), torch.cat(ys)

    train_x, train_y = load([f"data_batch_{i}" for i in range(1, 6)])
    test_x, test_y = load(["test_batch"])
    classes = [n.decode() for n in _unpickle(root / "batches.meta")[b"label_names"]]
    for split, y in (("train", train_y), ("test", test_y)):
        if y.numel() and not (int(y.min()) >= 0 and int(y.max()) < len(classes)):
            raise ValueError(f"{root}: {split} labels outside 0..{len(classes) - 1}")
    tensors = {"train_x": train_x, "train_y": train_y, "test_x": test_x, "test_y": test_y}
    return tensors, classes


def _read_idx(path: Path) -> torch.Tensor:
    """An idx file (MNIST's format): 0, 0, type (0x08 = ubyte), ndim, ndim big-endian int32 dims."""
    if not path.is_file() and path.with_name(path.name + ".gz").is_file():
        path = path.with_name(path.name + ".gz")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte idx file (magic {raw[:4].hex()})")
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    body = raw[4 + 4 * ndim :]
    if len(body) != math.prod(dims):
        raise ValueError(f"{path}: header says {dims} ({math.prod(dims)} bytes), has {len(body)}")
    return torch.frombuffer(bytearray(body), dtype=torch.uint8).reshape(dims)


def convert_mnist(raw_dir: str | Path) -> tuple[dict[str, torch.Tensor], list[str]]:
    """MNIST idx files (plain or .gz) -> ({train_x Nx1x28x28 uint8, train_y int64, ...}, names)."""
    root = Path(raw_dir)
    out = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        x = _read_idx(root / f"{prefix}-images-idx3-ubyte")
        y = _read_idx(root / f"{prefix}-labels-idx1-ubyte").to(torch.int64)
        if x.ndim != 3 or y.ndim != 1 or len(x) != len(y):
            raise ValueError(f"{root}: {split} images {tuple(x.shape)} vs labels {tuple(y.shape)}")
        out[f"{split}_x"], out[f"{split}_y"] = x.unsqueeze(1).contiguous(), y
    return out, list(MNIST_CLASSES)


# ---------------------------------------------------------------------------------------------
# Synthetic data
# ---------------------------------------------------------------------------------------------


def _machine_mb() -> int:
    """This machine's physical memory in MB (2**20 bytes)."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20


def make_synthetic(
    num_train: int, num_test: int, seed: int
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """A learnable CIFAR-shaped dataset (3x32x32 uint8, 10 balanced classes), fully seeded.

    Each class has a fixed template on a 40x40 canvas: a smooth random colour field (a 4x4 grid
    upsampled) plus colour-tinted stripes with a class-specific orientation ((k + 0.5) * 9
    degrees) and period. An image is a random 32x32 window of its class template (shift of up to
    +-4 px) plus Gaussian pixel noise, rounded and clipped to 0..255. Train and test use separate
    seeded streams, so the test set does not depend on num_train.
    """
    if num_train < 1 or num_test < 1:
        raise ValueError(
            f"synthetic: num_train ({num_train}) and num_test ({num_test}) must be >= 1"
        )
    k, c, size = 10, 3, 32
    canvas = size + 2 * CROP_PAD
    g = torch.Generator().manual_seed(derive_seed("synthetic-templates", seed))
    colour = F.interpolate(
        torch.rand(k, c, 4, 4, generator=g) * 2 - 1, size=(canvas, canvas), mode="bilinear"
    )
    # radians, one orientation per class, all in (0, 90) degrees: a horizontal flip (an
    # augmentation) maps theta to 180 - theta, which must not be another class's orientation
    theta = (torch.arange(k) + 0.5) * (math.pi / 2) / k
    period = 5 + 4 * torch.rand(k, generator=g)  # px
    phase = 2 * math.pi * torch.rand(k, generator=g)
    tint = torch.rand(k, c, generator=g) * 2 - 1
    yy, xx = torch.meshgrid(torch.arange(canvas), torch.arange(canvas), indexing="ij")
    proj = xx[None] * theta.cos()[:, None, None] + yy[None] * theta.sin()[:, None, None]
    stripes = torch.sin(2 * math.pi * proj / period[:, None, None] + phase[:, None, None])
    # 0-255 scale: mid-grey + colour field (+-15) + stripes (+-40); noise sigma 60 per pixel. A
    # nearest-class-mean classifier on raw pixels gets 80-94% of the test split (chance 10%;
    # default 50000/10000 set, seeds 0-7: 82% for seed 0, the templates each seed draws set
    # it): learnable, but the stripe orientation (a conv feature) is needed to go further.
    templates = 128 + 15 * colour + 40 * stripes[:, None] * tint[:, :, None, None]

    # past the machine's memory, before any allocation: 10**23 was torch.arange's
    # OverflowError, 3 * 10**9 labels (24 GB of int64) the kernel's kill of the process. Both
    # splits together: they are made, held and saved as one set
    mb = vocab.DATASETS["synthetic"].megabytes(num_train + num_test)
    if mb > (machine := _machine_mb()):
        raise PreparedDataError(
            f"synthetic: {num_train:,} train and {num_test:,} test images need {mb:,} MB of "
            f"memory, more than this machine's {machine:,} MB; prepare fewer (--num-train / "
            "--num-test, the config's synthetic.num_train / num_test)"
        )

    def split(n: int, tag: str) -> tuple[torch.Tensor, torch.Tensor]:
        gs = torch.Generator().manual_seed(derive_seed("synthetic", tag, seed))
        mb = vocab.DATASETS["synthetic"].megabytes(n)
        try:
            y = (torch.arange(n) % k)[torch.randperm(n, generator=gs)]
            x = torch.empty(n, c, size, size, dtype=torch.uint8)
        except RuntimeError as e:  # "DefaultCPUAllocator: can't allocate memory": a traceback
            raise PreparedDataError(
                f"synthetic: {n:,} {tag} images need {mb:,} MB of memory, more than "
                "this process could allocate; prepare fewer (--num-train / --num-test, the "
                "config's synthetic.num_train / num_test)"
            ) from e
        ar, ch = torch.arange(size), torch.arange(c)
        for s in range(0, n, 8192):  # chunks of 8192 images bound memory (~100 MB of float32)
            yb = y[s : s + 8192]
            b = len(yb)
            dy, dx = torch.randint(0, 2 * CROP_PAD + 1, (2, b, 1), generator=gs)
            rows, cols = dy + ar, dx + ar  # b x 32 window coordinates on the canvas
            img = templates[
                yb[:, None, None, None],
                ch[None, :, None, None],
                rows[:, None, :, None],
                cols[:, None, None, :],
            ]
            img += 60 * torch.randn(img.shape, generator=gs)
            x[s : s + b] = img.round_().clamp_(0, 255).to(torch.uint8)
        return x, y

    train_x, train_y = split(num_train, "train")
    test_x, test_y = split(num_test, "test")
    classes = [f"pattern_{i}" for i in range(k)]
    return {"train_x": train_x, "train_y": train_y, "test_x": test_x, "test_y": test_y}, classes


# ---------------------------------------------------------------------------------------------
# prepare-data
# ---------------------------------------------------------------------------------------------


def _channel_stats(x: torch.Tensor) -> tuple[list[float], list[float]]:
    """Per-channel mean and (population) std of uint8 images on the 0-1 scale.

    From a 256-bin histogram per channel (sums exact in float64, deterministic): 0.3 s for
    CIFAR-10's train split on 2 cores, against 1.3 s for summing int64 copies of the pixels.
    """
    values = torch.arange(256, dtype=torch.float64)
    mean, std = [], []
    for c in range(x.shape[1]):
        counts = torch.bincount(x[:, c].reshape(-1), minlength=256).to(torch.float64)
        m = float((counts * values).sum() / counts.sum())
        var = float((counts * (values - m) ** 2).sum() / counts.sum())
        mean.append(m / 255)
        std.append(math.sqrt(var) / 255)
    return mean, std


def _is_current(out_dir: Path, dataset: str, params: dict[str, Any]) -> bool:
    """Whether DIR/<dataset> holds what prepare would write: the format, the synthetic
    parameters, data.pt intact (its sha256), and what the trainer reads of meta.json
    (loaders.DIGEST_KEYS) true of that data.pt: the shapes, the dataset's class count and each
    channel's mean and std, recomputed (0.3 s for CIFAR-10). A meta.json whose mean or std was
    edited was "prepared and intact", and every run normalised with the edited values."""
    meta_path, data_path = out_dir / "meta.json", out_dir / "data.pt"
    if not (meta_path.is_file() and data_path.is_file()):
        return False
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(meta, dict):  # not prepare-data's: made again
        return False
    same = meta.get("format_version") == FORMAT_VERSION and meta.get("dataset") == dataset
    same = same and all(meta.get(key) == value for key, value in params.items())
    if not same or meta.get("num_classes") != vocab.DATASETS[dataset].classes:
        return False
    try:  # meta.json's fields, the shapes against data.pt and its sha256 (loaders.check_prepared)
        prepared = load_prepared(dataset, out_dir.parent)
    except PreparedDataError:
        return False
    mean, std = _channel_stats(prepared.train_x)
    # close, not equal: a float64 sum another torch build orders differently need not redo it
    stored = [*prepared.mean, *prepared.std]
    return all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(stored, [*mean, *std], strict=True))


def _check_mirror(mirror: str | None, out_dir: Path) -> None:
    """A ValueError naming the fix where --mirror is no URL prepare-data can fetch from: one
    with credentials, a host name the resolver cannot take, or a fragment (out_dir: where a
    file placed by hand goes)."""
    try:
        _, at, host = urllib.parse.urlsplit(mirror or "").netloc.rpartition("@")
    except ValueError as e:  # 'http://[::1/': "Invalid IPv6 URL", naming nothing
        raise ValueError(f"--mirror {_shown(mirror)!r} is no URL ({e}): fix it") from None
    if at:
        # urllib sends no credentials from a URL: it looked user:password@host up as a host
        # name ("Name or service not known"), and the error line printed the password
        raise ValueError(
            f"--mirror gives a user name or password (user:password@{host}), which "
            "prepare-data does not send: give a URL that needs none (a signed URL's ?token=... "
            f"is kept), or place the file in {out_dir / 'raw'} yourself"
        )
    try:  # a host name the resolver cannot take (an empty label, "a..b", or one of over 63
        # characters): urlopen's UnicodeError, a ValueError no download error caught, was a
        # codec's text naming neither the mirror nor the fix
        (urllib.parse.urlsplit(mirror or "").hostname or "").encode("idna")
    except UnicodeError as e:
        raise ValueError(
            f"--mirror {_shown(mirror)!r}: its host name is not valid ({e}): fix it"
        ) from None
    if mirror is not None and "#" in mirror:
        # a fragment is never sent to the server, and a file name joined after it (_url) was
        # no part of the URL asked for: refused, as a mirror that is no URL is
        raise ValueError(
            f"--mirror {_shown(mirror)!r} has a fragment (#...), which no server is sent: give "
            "the mirror's URL without it (a query, ?..., is kept)"
        )


def _obtain(
    dataset: str, params: dict, mirror: str | None, raw_dir: Path
) -> tuple[dict, list[str], str]:
    """(tensors, class names, source) of the dataset: made (synthetic), or downloaded into
    raw_dir (md5-checked; an archive already there is used) and converted; source says where
    the files came from."""
    if dataset == "synthetic":
        tensors, classes = make_synthetic(**params)
        source = "synthetic"
    elif dataset == "cifar10":
        base = mirror or CIFAR10_URL
        ((filename, md5),) = CIFAR10_FILES.items()
        # where the archive came from: the mirror, or raw/ when the one there was used
        source = _download(base, filename, md5, raw_dir)
        _extract(raw_dir / filename, raw_dir)
        tensors, classes = convert_cifar10(raw_dir)
    else:
        mirrors = [mirror] if mirror else list(MNIST_MIRRORS)
        used = set()
        for filename, md5 in MNIST_FILES.items():
            used.add(_download_any(mirrors, filename, md5, raw_dir))
            _extract(raw_dir / filename, raw_dir)  # .gz -> plain idx file
        tensors, classes = convert_mnist(raw_dir)
        source = " ".join(sorted(used))
    return tensors, classes, source


def prepare(
    dataset: str,
    data_dir: str | Path,
    *,
    num_train: int | None = None,
    num_test: int | None = None,
    seed: int | None = None,
    mirror: str | None = None,
    force: bool = False,
) -> Path:
    """Create DIR/<dataset>/{data.pt,meta.json} (no-op when present and intact); returns the dir."""
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; choose from {', '.join(DATASETS)}")
    if not str(data_dir).strip():  # "" is the current directory, which train refuses alike
        raise ValueError("--data-dir must not be empty")
    if str(data_dir).startswith("~"):
        # no shell expanded it (bash leaves `--data-dir=~/data` as typed): torchvision's download
        # expands it, the rest of prepare does not, so the archive went to $HOME/data and was
        # then looked for in ./~/data (the study config refuses ~ alike, study/config.py)
        raise ValueError(
            f"--data-dir {str(data_dir)!r} starts with ~, which no shell expanded (as in "
            f"--data-dir=~/...): give {os.path.expanduser(data_dir)}"
        )
    out_dir = Path(data_dir) / dataset
    params: dict[str, Any] = {}
    if dataset == "synthetic":
        if mirror is not None:  # refused like --seed for cifar10, not silently ignored
            raise ValueError(
                "--mirror applies only to --dataset cifar10 and mnist (synthetic is generated, "
                "not downloaded)"
            )
        given = {"num_train": num_train, "num_test": num_test, "seed": seed}
        params = {k: SYNTHETIC_DEFAULTS[k] if v is None else v for k, v in given.items()}
    elif any(v is not None for v in (num_train, num_test, seed)):
        raise ValueError("--num-train/--num-test/--seed apply only to --dataset synthetic")
    _check_mirror(mirror, out_dir)
    if not force and _is_current(out_dir, dataset, params):
        logger.info(
            f"prepare-data: {out_dir} is prepared and intact; nothing to do (--force redoes it)"
        )
        return out_dir

    meta_path, data_path = out_dir / "meta.json", out_dir / "data.pt"
    _make_dir(out_dir)
    tensors, classes, source = _obtain(dataset, params, mirror, out_dir / "raw")

    try:
        with atomic_open(data_path, "wb") as f:
            try:
                torch.save(tensors, f)
            except RuntimeError as e:  # a full disk: "enforce fail at inline_container.cc"
                # torch.save turns a Ctrl-C or a stop signal (cli.Stopped) raised in its writes
                # into the same error, the interrupt kept as its context: an interrupt, not a
                # failing disk (exit 130 or death by the signal, as everywhere else)
                if isinstance(e.__context__, KeyboardInterrupt):
                    raise e.__context__ from None
                # judged while the partial file still fills it
                raise _unwritten(f"cannot write {data_path}", e, out_dir) from e
    except OSError as e:
        raise _unwritten(f"cannot write {data_path}", e, out_dir) from e
    # meta.json marks completion: drop the old one only now that the new data.pt is in place
    # (atomic_open replaced it), so a failed download or write (a full disk) leaves an existing
    # preparation usable; until the new meta.json is written, the pair is incomplete
    try:
        meta_path.unlink(missing_ok=True)
    except OSError as e:
        raise _unwritten(f"cannot replace {meta_path}", e, out_dir) from e
    mean, std = _channel_stats(tensors["train_x"])
    meta = {
        "format_version": FORMAT_VERSION,
        "dataset": dataset,
        "classes": classes,
        "num_classes": len(classes),
        "train_shape": list(tensors["train_x"].shape),
        "test_shape": list(tensors["test_x"].shape),
        "mean": mean,
        "std": std,
        "sha256": files.sha256(data_path),  # of the bytes on disk, re-read after the write
        "source": source,
        **params,
    }
    try:
        write_json(meta_path, meta)  # last: marks the preparation complete
    except OSError as e:
        raise _unwritten(f"cannot write {meta_path}", e, out_dir) from e
    train_shape, test_shape = ("x".join(map(str, meta[k])) for k in ("train_shape", "test_shape"))
    logger.info(
        f"prepare-data: wrote {data_path} and {meta_path}: {dataset} train {train_shape}, "
        f"test {test_shape}, {len(classes)} classes"
    )
    return out_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, choices=DATASETS)
    parser.add_argument("--data-dir", required=True, help="writes DATA_DIR/<dataset>/")
    d = SYNTHETIC_DEFAULTS
    parser.add_argument("--num-train", type=int, help=f"synthetic only (default {d['num_train']})")
    parser.add_argument("--num-test", type=int, help=f"synthetic only (default {d['num_test']})")
    parser.add_argument("--seed", type=int, help=f"synthetic only (default {d['seed']})")
    parser.add_argument(
        "--mirror",
        help="base URL that replaces the official download location (a query, ?..., is kept)",
    )
    parser.add_argument("--force", action="store_true", help="redo even if prepared and intact")


def run(args: argparse.Namespace) -> int:
    log.setup()  # progress to stdout, the error to stderr
    schemes = ("http://", "https://", "file://")
    if args.mirror is not None and not args.mirror.startswith(schemes):
        logger.error(
            f"scalestudy prepare-data: --mirror {_shown(args.mirror)!r} is not a URL: give one "
            f"starting with {', '.join(schemes)}"
        )
        return 2
    try:
        prepare(
            args.dataset,
            args.data_dir,
            num_train=args.num_train,
            num_test=args.num_test,
            seed=args.seed,
            mirror=args.mirror,
            force=args.force,
        )
    except (DownloadError, PreparedDataError, ValueError) as e:
        # one line and exit 2, as every command's fixable problem (README "Troubleshooting")
        logger.error(f"scalestudy prepare-data: {e}")
        return 2
    return 0
