"""apt's and dpkg's messages as tritonfleet reads them: one pattern a message, each with the apt
or dpkg source file it comes from (the diagnosis, tritonfleet.host.apt_diagnosis, names causes
with them; the lock wait, tritonfleet.host.ops.aptlock, retries on ``LOCK_ERRORS``). A table of
apt 2.6's and dpkg 1.21's English texts (the commands run with ``LC_ALL=C.UTF-8``), captured on
Debian 12 (tests/fixtures/apt/)."""

from __future__ import annotations

import re

# apt/dpkg refusing because another process holds a lock (apt-pkg/contrib/fileutl.cc,
# apt-pkg/deb/debsystem.cc, apt-pkg/acquire.cc; dpkg's own words when apt-mark runs it). Also the
# shell pattern (grep -E) the lock wait retries on: keep both readings of it the same.
LOCK_ERRORS = (
    "Could not get lock|Unable to acquire the dpkg frontend lock|Unable to lock (the )?"
    "(administration )?directory|frontend lock was locked|status database area is locked"
)
LOCK_RE = re.compile(LOCK_ERRORS)
LOCK_HELD_RE = re.compile(r"Could not get lock (\S+?)\.? It is held by process (\d+)(?: \(([^)]*)\))?")
LOCK_FILE_RE = re.compile(
    r"Could not get lock (\S+?)\.?(?:\s|$)|dpkg frontend lock \(([^)]+)\)|"
    r"Unable to lock (?:the )?(?:administration )?directory \(?([^)\s]+)"
)
DPKG_LOCK_PID_RE = re.compile(r"lock was locked by another process with pid (\d+)")
WAITED_RE = re.compile(
    r"^tritonfleet: the apt/dpkg lock on \S+ stayed held by another process for more than "
    r"(\d+) s"
)

INTERRUPTED_RE = re.compile(r"dpkg was interrupted, you must manually run '([^']+)'")

# the sources cannot be read (apt-pkg/sourcelist.cc, apt-pkg/deb/debmetaindex.cc)
MALFORMED_RE = re.compile(
    r"Malformed (?:entry|line) (\d+) in (?:(?:list|sources) file|source list) (\S+)(?: \((.*)\))?"
)
TYPE_RE = re.compile(r"Type '([^']*)' is not known on line (\d+) in source list (\S+)")
CONFLICT_RE = re.compile(r"Conflicting values set for option (\S+) regarding source (\S+) (\S+)(?::|$)")
SOURCES_UNREADABLE = "The list of sources could not be read"

# apt-private/private-download.cc; strerror(ENOSPC) from dpkg or a download
NO_SPACE_RE = re.compile(r"You don't have enough free space in (\S+?)\.?$")
ENOSPC_RE = re.compile(r"No space left on device|Disk quota exceeded")

# apt-pkg/acquire-item.cc
EXPIRED_RE = re.compile(r"Release file for (\S+) is (expired|not valid yet) \(([^)]*)\)")
INFO_CHANGED_RE = re.compile(r"Repository '([^']+)' changed its '([^']+)' value from '([^']*)' to '([^']*)'")

# signatures (methods/gpgv.cc, apt-pkg/acquire-item.cc)
GPG_ERROR_RE = re.compile(r"^W: GPG error: (\S+)\s+(.*?): (.*)$")
KEYSIG_RE = re.compile(r"\b(NO_PUBKEY|EXPKEYSIG|BADSIG|REVKEYSIG|EXPSIG) ([0-9A-Fa-f]{8,40})(?: ([^\n]*?))?\s*$")
NOT_SIGNED_RE = re.compile(r"The repository '(\S+)\s*([^']*)' is not signed")
NO_RELEASE_RE = re.compile(r"The repository '(\S+)\s*([^']*)' (?:does not have|no longer has) a Release file")

# downloads (apt-pkg/acquire-item.cc, methods/connect.cc, methods/basehttp.cc)
FETCH_RE = re.compile(r"^[EW]: Failed to fetch (\S+)\s+(.*)$")
UNREACHABLE_RE = re.compile(
    r"Could not connect to ([^\s(]+)|Unable to connect to (\S+?):?(?:\s|$)|Temporary failure resolving '([^']+)'|"
    r"Could not resolve '([^']+)'|Connection timed out|Connection failed|Network is unreachable|"
    r"No route to host|Connection refused|Could not connect to server"
)
HTTP_STATUS_RE = re.compile(r"^\s*(\d{3})\s+(.*?)\s*(?:\[IP: [^\]]*\])?\s*$")
MISMATCH_RE = re.compile(r"Hash Sum mismatch|File has unexpected size|Size mismatch")
INDEX_FILE_RE = re.compile(
    r"/(?:In)?Release$|/Release\.gpg$|/Packages(?:\.\w+)?$|/Sources(?:\.\w+)?$|"
    r"/Translation-[\w.]+$|/Contents-[\w.-]+$|/by-hash/"
)

# the solver (apt-pkg/algorithms.cc, apt-private/private-install.cc, apt-private/private-cachefile.cc)
HELD_BROKEN = "you have held broken packages"
HELD_CHANGED = "Held packages were changed and -y was used without --allow-change-held-packages"
DOWNGRADED = "Packages were downgraded and -y was used without --allow-downgrades"
UNMET_RE = re.compile(r"Unmet dependencies|Unable to correct problems|The following packages have unmet dependencies")
DEPENDS_LINE_RE = re.compile(r"^\s+(\S+) : (?:Depends|PreDepends|Pre-Depends|Conflicts|Breaks|Recommends):|^\s{10,}\S")

# the package or version asked for (apt-pkg/cacheset.cc, apt-private/private-cacheset.cc)
VERSION_RE = re.compile(r"(Version|Release) '([^']+)' for '([^']+)' was not found")
LOCATE_RE = re.compile(r"Unable to locate package (\S+)")
GLOB_RE = re.compile(r"Couldn't find any package by (?:glob|regex) '([^']+)'")
NO_CANDIDATE_RE = re.compile(r"Package '([^']+)' has no installation candidate")

# dpkg (its own words) and apt running it (apt-pkg/contrib/fileutl.cc)
DPKG_PROCESSING_RE = re.compile(r"^dpkg: error processing (?:package|archive) (\S+?)(?: \(([^)]*)\))?:\s*$")
SUBPROCESS_RE = re.compile(
    r"Sub-process (\S+(?: \S+)?) (?:returned an error code \((\d+)\)|received a segmentation fault"
    r"|exited unexpectedly)"
)
DPKG_ERROR_RE = re.compile(r"^dpkg: error:? (.*)$|^dpkg: dependency problems")

NOISE_RE = re.compile(
    r"^(?:Hit|Get|Ign):\d+ |^Reading (?:package lists|state information)|^Building dependency tree|"
    r"^Fetched |^\(Reading database|^debconf: |^Need to get |^After this operation|"
    r"^\d+ upgraded, \d+ newly installed|^Selecting previously unselected|^Preparing to unpack|"
    r"^Unpacking |^Processing triggers|^Setting up |^Removing |^Purging "
)
OWN_RE = re.compile(r"^tritonfleet: |^waited \d+ s for the apt/dpkg lock")
