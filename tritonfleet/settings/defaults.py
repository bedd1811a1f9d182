# Every tunable of tritonfleet lives here, once, with its default and what it does.
# An operator's group data (inventories/group_data/all.py, <group>.py) and inventory hold only
# what differs; every value not set there is taken from here (tritonfleet.settings.access.get, and the
# fleet commands' inventory).
# Precedence (pyinfra): --data > host data > group_data/<group>.py > inventory group data >
# group_data/all.py > these defaults.
# docs/tunables.md lists the same names (`python -m tritonfleet.tunables` writes that table; a
# test keeps them in step).

# --- SSH ----------------------------------------------------------------------------------
# Host keys: "yes" connects only to hosts whose key is already in known_hosts (~/.ssh/known_hosts,
# or UserKnownHostsFile in ~/.ssh/config; fill it with ssh-keyscan after checking the keys) and
# refuses unknown or changed keys. pyinfra's own default, "accept-new", trusts any host on first
# contact. Only the testbed inventory turns this off (its hosts share one image's host keys).
# pyinfra reads this one itself when it connects, before the deploy file runs, so group_data/all.py
# has to name it (`tritonfleet init` writes it there); pre-flight refuses an SSH host without it.
ssh_strict_host_key_checking = "yes"
# Seconds between keepalive probes on every SSH connection (pyinfra's own, the OpenSSH transfers,
# health tunnels, the deploy lock): OpenSSH's ServerAliveInterval, paramiko's transport keepalive,
# TCP keepalive.
ssh_keepalive_interval = 10
# Unanswered probes after which a host counts as gone (ServerAliveCountMax, TCP_KEEPCNT): a host
# that stops answering fails after ssh_keepalive_interval x ssh_keepalive_count seconds.
ssh_keepalive_count = 3
# Keep the SSH login user's systemd manager running between sessions (loginctl enable-linger
# <user>, the user sudo was run by when the deploy uses sudo). logind stops it 10 s after the
# user's last session (UserStopDelaySec=, logind.conf(5)) and the next SSH session waits while it
# starts again: on the test hosts `ssh host true` took 328-336 ms after 13 s without a session and
# 257-269 ms with linger, a deploy's one read 0.14 s against 0.11 s (docs/scale.md). Costs one
# idle `systemd --user` process for that user. False leaves the host's linger setting as it is
# (it does not turn linger off).
ssh_user_linger = True
# Seconds a deploy waits while another run holds a host's deploy lock (one run at a time per
# host), before it stops with nothing changed, naming the holder; 0: do not wait.
deploy_lock_timeout = 600

# --- Target OS ---------------------------------------------------------------------------
# Distro codename used in NVIDIA's CUDA repository path (ubuntu2204, ubuntu2404, ubuntu2604, debian12).
# None: derived from the host's /etc/os-release.
cuda_distro = None
# Seconds an apt/dpkg command waits while another process (unattended-upgrades, an operator's apt)
# holds the package manager's locks, before the host fails with what held them; 0: do not wait.
apt_lock_timeout = 300

# --- NVIDIA driver ------------------------------------------------------------------------
# CUDA network repository (a directory per distro/arch below it).
cuda_repo_url = "https://developer.download.nvidia.com/compute/cuda/repos"
# Signing key file inside <cuda_repo_url>/<distro>/<arch>/ and its pinned fingerprint.
# The key is fetched on the host and trusted only if its fingerprint equals this one.
cuda_repo_key_name = "3bf863cc.pub"
# Pinned fingerprint of the CUDA repository key (NVIDIA's 3bf863cc key).
cuda_repo_key_fingerprint = "EB693B3035CD5710E231E123A4B469963BF863CC"
# Where the driver comes from: "cuda" (NVIDIA's CUDA repository) or "debian" (Debian's own
# nvidia-driver from contrib/non-free: branch 535 on Debian 12, 550 on Debian 13, with DKMS; pinned
# and held the same way; docs/driver-sources.md). Pre-flight refuses a host whose driver came from another source (the
# other of these, Ubuntu's packages, the .run installer) unless nvidia_driver_migrate.
nvidia_driver_source = "cuda"
# Remove a driver from another source (holds lifted, packages purged, the .run uninstaller run)
# before installing nvidia_driver_source's, then reboot once. False: pre-flight refuses such a host.
nvidia_driver_migrate = False
# Driver branch (e.g. "580"); None: the distro's entry in nvidia_driver_branch_default. Pre-flight
# refuses a branch NVIDIA's repository for the host's distro does not have, or the Triton image
# cannot use, naming the branches that would work (docs/nvidia-repositories.md).
nvidia_driver_branch = None
# Driver branch per CUDA repository distro when nvidia_driver_branch is None. Each exists in that
# repository and Triton 24.08 supports it on T4/L4 (>= 560); R580 is NVIDIA's long-term support
# branch and has NVIDIA's pinning package (nvidia-driver-pinning-580). Debian 12's repository has no R535.
# "debian12-archive": Debian 12's own packages (nvidia_driver_source = "debian"), which have only
# R535 (a data-center branch Triton 24.08 supports through forward compatibility, from 535.86);
# "debian13-archive": Debian 13's, R550 only (Triton 24.05 runs on it, 24.08 does not: pre-flight says so).
# "ubuntu2604": NVIDIA's repository for Ubuntu 26.04 has only R595 (a production branch, CUDA 13).
nvidia_driver_branch_default = {"ubuntu2204": "580", "ubuntu2404": "580", "ubuntu2604": "595", "debian12": "580", "debian12-archive": "535", "debian13-archive": "550"}
# Exact driver release to pin: the upstream version (e.g. "580.159.04"; every package of the
# driver at that release, in the distro's own version shape: 580.159.04-1 on Debian, -0ubuntu1 on
# Ubuntu) or a full package version of the metapackage; None: newest of the branch.
nvidia_driver_version = None
# Driver packages to install instead of the branch's metapackage from NVIDIA's repository
# (cuda-drivers-<branch>, or cuda-drivers from 590); "{branch}" is replaced by the branch.
# None: the metapackage (tritonfleet/data/nvidia_repos/<distro>.toml).
nvidia_driver_packages = None
# Kernel module flavour: "open" (NVIDIA's open GPU kernel modules, dual MIT/GPL; Turing and newer,
# so T4 and L4) or "proprietary"; a GPU class sets it in group_data/<class>.py like
# nvidia_driver_branch. None: NVIDIA's own default for the branch, "open" from R560 ("the open
# kernel module flavor is the default and suggested installation", NVIDIA's driver installation
# guide) and "proprietary" before. Installed with the flavour's packages (nvidia-open-<branch> or
# cuda-drivers-<branch>; a host with the other flavour is switched), checked after the install
# (modinfo's licence, /proc/driver/nvidia/version); another flavour on a host is drift in status.
nvidia_kernel_module = None
# Kernel headers and DKMS so the module is rebuilt on kernel upgrades; "{kernel}" = uname -r.
nvidia_kernel_packages = ["linux-headers-{kernel}", "dkms"]
# Hold the driver packages (apt-mark hold + unattended-upgrades blacklist).
nvidia_hold_packages = True
# Enable the nvidia-persistenced service.
nvidia_persistenced = True
# Secure Boot hosts stop before the driver step unless this says the module will load there
# (MOK enrolled for DKMS signing, or signed precompiled modules in nvidia_driver_packages).
nvidia_secure_boot_ok = False
# When Secure Boot's state cannot be told (a UEFI host without mokutil, or mokutil failing, and
# efivarfs unreadable), hosts stop before the driver step unless this says it is off or handled.
nvidia_secure_boot_unknown_ok = False
# Reboot when the loaded driver does not match the installed one (after a driver change).
nvidia_reboot_if_needed = True
# Seconds to wait for a rebooted host to answer SSH again.
nvidia_reboot_timeout = 600
# The command the deploy asks the host's driver with (the driver step's loaded-driver and
# persistence checks, pre-flight's GPU check, the GPU verification's host half, the Triton step's
# GPU guard, `tritonfleet status`): nvidia-smi on PATH; a path where the host's own nvidia-smi cannot answer for its GPUs
# (the testbed points a host without a GPU at its stand-in's answer). Inside `docker run --gpus all`
# the container's nvidia-smi is the one the Container Toolkit put there.
nvidia_smi_command = "nvidia-smi"

# --- Docker Engine ------------------------------------------------------------------------
# "docker": Docker's apt repository (pinned key + version); "distro": the distro's docker.io.
docker_source = "docker"
# Docker's apt repository (a directory per distro below it).
docker_repo_url = "https://download.docker.com/linux"
# Pinned fingerprint of Docker's repository key.
docker_repo_key_fingerprint = "9DC858229FC7DD38854AE2D88D81803C0EBFCD88"
# Docker Engine version (docker-ce, docker-ce-cli), pinned in apt preferences: an upstream version
# ("27.3.1": 5:27.3.1-1~<distro> on every distro) or an exact package version
# ("5:27.3.1-1~ubuntu.22.04~jammy"); None: newest. Checked after the install.
docker_version = "27.3.1"

# --- NVIDIA Container Toolkit ------------------------------------------------------------
# Container Toolkit apt repository (a directory per architecture below it).
container_toolkit_repo_url = "https://nvidia.github.io/libnvidia-container/stable/deb"
# Container Toolkit signing key (ASCII-armored).
container_toolkit_key_url = "https://nvidia.github.io/libnvidia-container/gpgkey"
# Pinned fingerprint of the Container Toolkit key.
container_toolkit_key_fingerprint = "C95B321B61E88C1809C4F759DDCAE044F796ECB0"
# The four toolkit packages are pinned together to this version. 1.17.8 fixes the container escapes
# CVE-2025-23359, CVE-2025-23266 and CVE-2025-23267 (1.16.2 has all three) and injects the CUDA
# forward-compatibility libraries through a hook (1.17.4 alone dropped them: Triton 24.08 then fails
# on R535/R545 drivers). See docs/nvidia-repositories.md.
container_toolkit_version = "1.17.8-1"

# --- GPU verification --------------------------------------------------------------------
# Image that proves `docker run --gpus all` reaches the GPU. Its CUDA (12.8) runs on every default
# branch (R570 and newer) without forward compatibility; 12.2.0 is end of life and NVIDIA deletes
# such tags. Pre-flight names the image each host will pull.
cuda_test_image = "nvidia/cuda:12.8.1-base-ubuntu22.04"
# Lowest compute capability accepted (the runbook: 6.0).
gpu_min_compute_capability = "6.0"
# Lowest CUDA version (as nvidia-smi reports it) accepted.
gpu_min_cuda_version = "12.0"
# When the check inside `docker run --gpus all` runs: "changes" when anything it depends on is
# new since it last passed (boot, driver and GPUs as nvidia-smi reports them, toolkit, Docker or
# containerd packages, daemon.json, the test image); "always": every run. The host's own
# nvidia-smi check runs every time either way.
gpu_verify_container = "changes"
# GPUs every host (or class, in group data) must report (None: as many as the first verified
# run found, recorded on the host in /var/lib/tritonfleet/gpus). Fewer fails the GPU
# verification naming the missing GPUs by index, bus id and UUID (docs/multi-gpu.md).
gpu_count = None

# --- Triton images ------------------------------------------------------------------------
# How model files and image archives travel to hosts: "ssh" (the OpenSSH client with the host's
# connection settings; about rsync's speed), "connection" (pyinfra's own SSH connection; about 3x
# slower for gigabytes, works with password authentication), "auto" (ssh when the host uses key
# or agent authentication).
bulk_transfer = "auto"
# The Triton image every host serves: a pinned tag, or a tag pinned to its digest
# ("nvcr.io/nvidia/tritonserver:24.08-py3@sha256:<digest>": a tag moved in the registry changes
# nothing; the tag names the Triton release the driver check needs).
triton_image = "nvcr.io/nvidia/tritonserver:24.08-py3"
# Image archives to `docker load` instead of pulling (air-gapped sites): {image: local path}.
image_archives = {}
# Private registry login: user name, and the environment variable holding the secret
# (read on the control machine, passed to `docker login --password-stdin`). None: no login.
registry_user = None
# Environment variable on the control machine holding the registry secret.
registry_password_env = "TRITONFLEET_REGISTRY_PASSWORD"
# Registry the login is for (e.g. "nvcr.io"); None: the registry of triton_image. Images from
# other registries (Docker Hub's nvidia/cuda) are pulled without it.
registry_host = None

# --- Triton model repository --------------------------------------------------------------
# Local model repository (relative to the working directory) synced to every host.
model_repository = "files/model_repository"
# Per-class overrides of config.pbtxt (rendered through templates): {model: {key: value}}.
model_overrides = {}
# Instance-group placement on a host's GPUs: "spread" (a KIND_GPU group written `gpus: [ 0 ]`
# lists every GPU the host has, same count per GPU) or "as-written" (configs as they are). A
# one-GPU host keeps the configs byte for byte either way (docs/multi-gpu.md).
gpu_placement = "spread"
# Per-model placement policy, over gpu_placement: {model: "spread" | "as-written"}.
gpu_placement_models = {}
# Where releases of the model repository live on the host; `current` points at the live one.
triton_base_dir = "/opt/triton"
# How many previous model releases to keep on the host (for rollback).
triton_keep_releases = 3

# --- Model origin (docs/model-origin.md) ---------------------------------------------------
# Where hosts fetch release contents from, instead of the control machine sending every byte over
# SSH: None (the push over SSH, for small fleets), an S3-compatible bucket and prefix
# ("s3://bucket/prefix": AWS S3, GCS's interoperability API, MinIO, Ceph) or a plain HTTP(S) server
# ("https://models.internal/triton": nginx in an air-gapped site). The control machine uploads the
# objects the origin lacks (named by SHA-256) and the release manifest; each host fetches only the
# objects its release cache lacks (curl, in parallel, resumable), verifies every hash, and the
# release is assembled and switched exactly as a pushed one. A deploy stages (fetches) the release
# on every host before any host switches to it.
model_origin = None
# S3 API endpoint for an s3:// origin that is not AWS (MinIO, Ceph, GCS: https://storage.googleapis.com);
# None: AWS, from model_origin_region. The control machine's credentials are boto3's own (the
# environment, ~/.aws, its instance role).
model_origin_endpoint = None
# Region of the bucket (S3 signatures name it); None: us-east-1.
model_origin_region = None
# "presigned": hosts get URLs signed on the control machine that expire after
# model_origin_url_expiry seconds (no credential on the hosts); "host": the host's own access (an
# HTTP origin: plain URLs, curl's ~/.netrc; S3: curl signs with the credentials in
# model_origin_credentials_file). An HTTP origin is always "host".
model_origin_auth = "presigned"
# Seconds a presigned URL is valid (60-604800); a transfer started before it expires completes.
model_origin_url_expiry = 1800
# model_origin_auth = "host" with an S3 origin: file on each host with AWS_ACCESS_KEY_ID,
# AWS_SECRET_ACCESS_KEY and optionally AWS_SESSION_TOKEN (shell assignments, mode 0600), as the
# host's role or secret agent writes them.
model_origin_credentials_file = "/etc/tritonfleet/origin-credentials"
# HTTP origin: URL the control machine uploads to with PUT (nginx: dav_methods PUT); None: model_origin.
model_origin_upload_url = None
# HTTP origin: basic-auth user for the uploads (None: none).
model_origin_upload_user = None
# Environment variable on the control machine holding the upload user's password.
model_origin_upload_password_env = "TRITONFLEET_ORIGIN_PASSWORD"
# Objects a host fetches at once (curl --parallel-max).
model_origin_parallel = 8
# Retries of a failed object fetch (curl --retry, resuming what arrived); a transfer that moves no
# byte for 60 s fails (and resumes on the next run).
model_origin_retries = 3

# --- Model fan-out: a wave's hosts serve each other a release (docs/model-origin.md#fan-out) -------
# Staging (deploys/stage.py, `rollout --stage`) with a model origin takes the release's objects from
# the wave's other hosts (BitTorrent: aria2c, Debian's package, installed on the hosts by staging)
# before asking the origin for what is still missing. The seeds take it from the origin as their
# web seed, every other host from its peers, so the origin sends each byte about once whatever the
# number of hosts. Every object is still checked by its SHA-256 before use; a host whose swarm
# fails fetches from the origin directly. Needs an origin the hosts read with plain URLs (an HTTP
# origin): with presigned S3 URLs staging fetches directly. The push deploy is unchanged.
model_fanout = False
# The tracker's announce URL ("http://tracker:6969/announce": an opentracker the operator runs,
# whose whitelist must hold each release's info hash, which staging logs). None: the wave's first
# host by name runs Debian's opentracker (installed by staging; its own service on TCP 6969, the
# whitelist written with the run's releases before any host joins the swarm).
model_fanout_tracker = None
# Port each host's aria2c listens on for its peers (TCP, the hosts' network).
model_fanout_port = 6881
# Piece size of the release's torrent in KiB (a power of two, at least 16): what one SHA-1 covers,
# what a peer asks for at once.
model_fanout_piece_kb = 1024
# Minutes a host keeps serving the release to the rest of the wave after its own download.
model_fanout_seed_minutes = 10
# Seconds the swarm may bring no byte before the host gives up on it (its peers and seeds are
# gone) and fetches the rest from the origin.
model_fanout_stall_seconds = 30
# Seconds a host waits for the swarm at most before it fetches the rest from the origin.
model_fanout_wait_seconds = 1800
# Per host (host data): its zone or rack (None: one zone for the whole wave). Each zone has a
# seed that takes the release from the origin; so the origin sends it once per zone.
fanout_zone = None
# Per host: True makes it a seed, False never one; None: the zone's first host by name seeds when
# no host of the zone says True.
fanout_seed = None
# Staging (`rollout --stage`) with an image mirror shares the pinned Triton image's blobs between
# the wave's hosts (BitTorrent: aria2c, Debian's opentracker on the mirror host): one host a zone
# (fanout_zone, fanout_seed, as for the release) reads the blobs from the mirror's registry as its
# web seed (as the mirror's client: its login and CA), the others from their peers; each blob is
# checked by its digest, then loaded into Docker by digest through a throwaway registry on
# 127.0.0.1, so the mirror sends each blob about once per zone a wave instead of once per host
# (docs/model-origin.md#the-image). A host whose swarm fails pulls through the mirror as before.
# Uses model_fanout_seed_minutes, _stall_seconds, _wait_seconds and _piece_kb. The push deploy is
# unchanged.
image_fanout = False
# Port each host's aria2c listens on for the image's swarm (TCP; beside model_fanout_port).
image_fanout_port = 6882
# Port of the throwaway registry on each GPU host's 127.0.0.1 while Docker loads the image from it.
image_fanout_local_port = 5079

# --- Image mirror: a pull-through cache for the Triton image (docs/model-origin.md) ------------
# "host:port" of a pull-through registry the hosts pull through (None: pull from the image's own
# registry). Images of image_mirror_upstream's registry are rewritten to it and must be pinned by
# digest (triton_image = "nvcr.io/nvidia/tritonserver:24.08-py3@sha256:..."): every read of
# triton_image and cuda_test_image through the deploy's settings gets <mirror>/<path>:<tag>@<digest>.
# Docker's own registry-mirrors (daemon.json) covers Docker Hub only.
image_mirror = None
# The registry the mirror proxies (one per mirror: Distribution's proxy.remoteurl).
image_mirror_upstream = "https://nvcr.io"
# Inventory group whose hosts run the mirror (deploys/mirror.py sets it up there; a staging run
# fills it there before the hosts pull).
image_mirror_group = "image_mirror"
# Port the mirror serves on.
image_mirror_port = 5000
# Address (no port) the mirror listens on, on its host; None: the address part of image_mirror.
# Never every address: whoever reaches the mirror pulls through the upstream login
# (registry_user), so it listens where the hosts reach it and nowhere else (docs/model-origin.md).
image_mirror_listen = None
# TLS certificate for the mirror (path on the control machine; put on the mirror host); None:
# plain HTTP (then every Docker host needs the mirror in daemon.json's insecure-registries).
image_mirror_tls_cert = None
# The certificate's private key (path on the control machine; put on the mirror host, 0600).
image_mirror_tls_key = None
# CA that signed image_mirror_tls_cert (path on the control machine): put on every host as
# /etc/docker/certs.d/<image_mirror>/ca.crt, which Docker reads on each pull (no daemon restart).
image_mirror_ca = None
# Where the mirror keeps what it fetched (on the mirror host).
image_mirror_storage = "/var/lib/docker-registry"
# The mirror asks every client for its own credential (Distribution's htpasswd auth): the hosts
# `docker login` to it as mirror_client_user before they pull through it, so whoever merely reaches
# the mirror cannot pull through its upstream login. False: an open mirror (reach restricted by
# the network alone; docs/model-origin.md).
image_mirror_auth = True
# The mirror's client login name (a mirror-only credential, not the upstream's registry_user).
mirror_client_user = "tritonfleet"
# Environment variable on the control machine holding the mirror's client password (read when
# the commands run, sent on stdin: hashed on the mirror host, `docker login --password-stdin` on
# the hosts). At most 72 bytes, one line.
mirror_client_password_env = "TRITONFLEET_MIRROR_PASSWORD"

# --- Triton service -----------------------------------------------------------------------
# systemd unit name (triton.service).
triton_service = "triton"
# Docker container name the unit runs.
triton_container_name = "triton-server"
# Host port for HTTP/REST (container 8000).
triton_http_port = 8000
# Host port for gRPC (container 8001).
triton_grpc_port = 8001
# Host port for Prometheus metrics (container 8002).
triton_metrics_port = 8002
# Bind address of the HTTP port ("" = all). Narrow the ports behind a firewall/LB; docker -p
# rules go around ufw/firewalld (Docker writes its own iptables rules): see docs/security.md.
triton_http_bind = ""
# Bind address of the gRPC port ("" = all).
triton_grpc_bind = ""
# Bind address of the metrics port ("" = all).
triton_metrics_bind = ""
# docker run flags; set a flag to None to drop it (e.g. memlock on hosts that cannot raise it).
triton_gpus = "all"
# --shm-size (Docker's 64 MB default makes Triton crash under load).
triton_shm_size = "1g"
# --ulimit memlock (NVIDIA recommends -1; None drops the flag).
triton_ulimit_memlock = "-1"
# --ulimit stack (NVIDIA recommends 67108864; None drops the flag).
triton_ulimit_stack = "67108864"
# --strict-model-config=true: every model needs a complete config.pbtxt.
triton_strict_model_config = True
# none | explicit (explicit: models loaded through the repository API, zero-downtime updates)
triton_model_control_mode = "none"
# Extra arguments appended to the tritonserver command line.
triton_extra_args = []
# Triton API categories only callers with the host's API key may use (--http-restricted-api,
# --grpc-restricted-protocol; Triton's own "admin" example plus logging); [] turns it off.
triton_restricted_apis = ["model-repository", "model-config", "shared-memory", "statistics", "trace", "logging"]
# The host's API key for the restricted APIs: created on the host (0600 root), read by systemd
# into the container's stdin; the deploy's own repository calls send it as a header.
triton_api_key_file = "/etc/tritonfleet/triton-api-key"
# User the container runs as (the NGC image's non-root triton-server, uid 1000); "" = the image's.
triton_container_user = "triton-server"
# Seconds systemd waits for the container to start (image unpack can be slow).
triton_start_timeout = 600
# Seconds Triton waits for requests in flight when it stops (--exit-timeout-secs); Docker's stop
# timeout (docker stop -t) is 10 s more and systemd's TimeoutStopSec 30 s more, so neither kills
# Triton while it still finishes requests (docs/operations.md).
triton_stop_timeout = 30

# One Triton per GPU (docs/multi-gpu.md): True runs one unit <triton_service>-gpu<N> per GPU the
# host has (gpu_count, else its GPU record), each container with --gpus device=N and the ports
# above plus N * triton_per_gpu_port_step; False: one unit with triton_gpus (all GPUs).
triton_per_gpu = False
# Port offset between two per-GPU instances: GPU N serves HTTP on triton_http_port + N * step
# (gRPC and metrics alike); at least the spread of the three ports so no two instances collide.
triton_per_gpu_port_step = 10

# --- Rollout and rollback -------------------------------------------------------------------
# Deployment a rollback returns to, per host: {host: {"release": id, "unit": digest}}. Set by
# `tritonfleet rollout` (what the host served before its batch); empty: the newest recorded
# healthy deployment that differs from what the host has now.
rollback_to = {}
# Hosts the fleet commands (status, a rollout's probe and health gates, tune) read at once, each
# on a thread of its own with one SSH connection; bounded by the open-file limit
# (tritonfleet/core/open_files.py). A rollout's health gates mostly wait (model loading), so a batch's
# gates take about ceil(batch / fleet_parallel) x the slowest host's gate: keep it >= the batch.
fleet_parallel = 100
# Worker processes a run spreads its hosts over (tritonfleet deploy, status, every phase of
# rollout: each its own share of the hosts, in its own pyinfra or forked process; one process
# uses one core). 0: one per CPU of the control machine. Runs of fewer than 20 hosts a worker
# stay in fewer processes (tritonfleet/fleet/runner/workers.py).
fleet_workers = 0

# --- Rollout: capacity, traffic canary, host states (docs/fleet-operations.md) --------------
# Most servers of a host's HAProxy backend that may be out of HAProxy at once during a rollout
# (out already plus the batch): hosts, or a percentage of the backend's servers ("25%", rounded
# down). A batch that would take more waits for capacity; one that never could is refused.
# None: no limit. Needs lb = "haproxy" (its state is what is checked).
rollout_max_unavailable = None
# Fewest servers of the backend that must keep serving while a batch is out: hosts or a
# percentage ("75%", rounded up). None: no floor. Needs lb = "haproxy".
rollout_min_available = None
# The same floor per model: {model: hosts or "P%"} of the backend's servers whose host serves the
# model (its model repository). {}: none.
rollout_min_available_models = {}
# Seconds a batch waits for the capacity rules to allow it (HAProxy read every second) before the
# rollout halts, naming the numbers.
rollout_capacity_wait = 600
# Where a running rollout serves its hosts' states as Prometheus metrics ("address:port"; a port
# already taken is reported and the rollout goes on); None: not served (status still shows them).
rollout_metrics_listen = "127.0.0.1:9469"
# Traffic canary: the percentage of the backend's traffic HAProxy's weights give the canary hosts
# while the canary is analysed (5: 5%); None: a whole-host canary gated on health only.
# `tritonfleet rollout --canary-weight` overrides it. Needs lb = "haproxy" and Prometheus.
canary_weight = None
# Prometheus that scrapes the hosts' Triton metrics with the labels `tritonfleet prometheus`
# writes (host, job): the canary analysis reads it (http://host:9090).
canary_prometheus_url = None
# The scrape job of the Triton targets in that Prometheus.
canary_prometheus_job = "triton"
# Model the canary is judged on; None: every model of the host, summed.
canary_model = None
# Seconds of traffic each look of the canary analysis waits for (its window).
canary_analysis_seconds = 300
# Width in seconds of the steps the window is cut into for the latency test (each host's mean of
# a step is one sample; at least 2 scrape intervals, and at least 5 steps a window).
canary_step_seconds = 30
# Looks added when a window is not enough to judge (too few requests, a marginal figure); after
# the last one an undecided canary is rolled back.
canary_max_extensions = 2
# Fewest requests the canary hosts and the baseline hosts each need in the window to be judged.
canary_min_requests = 500
# Significance level of the canary's tests (Fisher's exact test on errors, Mann-Whitney U on
# latency): a regression needs p below it.
canary_alpha = 0.01
# Rollback when the canary's error ratio is above the baseline's by more than this (0.005: half a
# percentage point) and significantly so.
canary_max_error_increase = 0.005
# Rollback when the canary's mean request time is above the baseline's by more than this share
# (0.2: 20%) and significantly so.
canary_max_latency_rise = 0.2
# Seconds the canary's watchdog (a detached process started with the canary's weights) waits for
# the rollout's heartbeat (renewed every few seconds) before it puts HAProxy's weights back
# itself; it also does at once when the rollout's process is gone (SIGKILL, OOM).
canary_watchdog_ttl = 60

# --- Load balancer drain (docs/operations.md) ---------------------------------------------
# Load balancer in front of the hosts: "haproxy" (its runtime API), "hooks" (lb_drain_command and
# lb_ready_command) or None (no drain). With one, every restart of Triton is preceded by a drain
# that waits until no request is in flight, and the host goes back once the health gate passed.
lb = None
# HAProxy runtime API addresses, as the control machine reaches them: unix socket paths or
# "host:port" of `stats socket ... level admin` (several HAProxy instances: all of them).
lb_haproxy_sockets = []
# HAProxy backend that holds the hosts' Triton servers.
lb_haproxy_backend = "triton"
# The host's server name in that backend; None: the inventory host name.
lb_haproxy_server = None
# lb = "hooks": command run on the control machine (sh -c) to take the host out; the environment
# has TRITONFLEET_HOST, TRITONFLEET_ADDRESS and TRITONFLEET_HTTP_PORT. A non-zero exit fails the
# host before Triton is touched.
lb_drain_command = None
# lb = "hooks": command that puts the host back; runs after every passing health gate of a deploy
# (so make it idempotent), with the same environment.
lb_ready_command = None
# Seconds to wait after the drain until no request is in flight (HAProxy: the server's current
# sessions; hooks: Triton's queue empty and its request counters still for 2 s), and after ready
# until HAProxy's health checks report the server up. Past it the host fails, Triton untouched.
lb_drain_timeout = 120

# --- Health gate --------------------------------------------------------------------------
# "direct": HTTP to the host's ports; "ssh": through a tunnel over the host's SSH connection.
health_via = "direct"
# Address the control machine uses for the host's Triton ports; None: the SSH address.
health_host = None
# Total seconds to wait for live/ready/model-ready/metrics.
health_timeout = 180
# Seconds for each health request.
health_request_timeout = 5
# After the health gate's endpoints pass, each model answers one real inference (batch 1, inputs
# built from its config.pbtxt, output shapes checked): a model that is ready but fails it fails the
# host with Triton's answer (docs/operations.md). False: endpoints only.
health_warm_inference = True
# A plain deploy whose health gate fails a host that served before puts that host back on its
# last healthy deployment at once (the steps of deploys/rollback.py) and says so in the report; off:
# the report prints the rollback command. tritonfleet rollout always rolls a failed host back itself.
auto_rollback = False

# --- Monitoring (tritonfleet prometheus, tritonfleet tune) -----------------------------------
# Alert when a model's mean request time (queue + compute, from Triton's _us counters) stays
# above this many milliseconds.
monitor_latency_ms = 1000
# Alert when more than this share of a model's requests fails.
monitor_failure_ratio = 0.05
# Mean queue time above this multiple of the mean compute time counts as "queue dominates".
monitor_queue_compute_ratio = 1.0
# Utilization (0-1) under which a model whose queue dominates should lower
# max_queue_delay_microseconds (the runbook's 40%).
monitor_low_utilization = 0.4
# Utilization (0-1) above which a model that runs small batches should raise
# max_queue_delay_microseconds (tritonfleet tune).
monitor_busy_utilization = 0.8
# Alert when a GPU's used memory exceeds this share of its total.
monitor_gpu_memory_ratio = 0.9

# --- Performance gate (tritonfleet rollout --perf-gate) ------------------------------------
# Model the performance gate loads on each canary before and after its update; None: the
# first model (by name) the canary serves before the update.
perf_gate_model = None
# Requests the performance gate keeps in flight (batch 1 each, HTTP).
perf_gate_concurrency = 16
# Seconds of load for each of the two measurements (before and after the update).
perf_gate_duration = 5
# The canary fails the performance gate (and is rolled back) when its throughput after the
# update is lower than before by more than this share (0.2: more than 20% lower).
perf_gate_max_throughput_drop = 0.2
# The canary fails the performance gate when its p95 latency after the update is higher than
# before by more than this share (0.5: more than 50% higher).
perf_gate_max_p95_rise = 0.5

# --- GPU health: telemetry, inference probe, quarantine (docs/operations.md) ----------------
# deploys/telemetry.py on this host: True installs and runs the GPU fault collector and the
# inference probe (node exporter textfiles) and `tritonfleet prometheus` scrapes the host's node
# exporter; False removes the two services (the node exporter package stays) and scrapes nothing.
gpu_telemetry = True
# Install the distro's node exporter (prometheus-node-exporter, no recommends) and keep it running;
# False: the operator runs one whose --collector.textfile.directory is telemetry_textfile_dir.
telemetry_node_exporter = True
# The node exporter's port, as Prometheus reaches the host (health_host, else the SSH address).
telemetry_node_exporter_port = 9100
# The node exporter's textfile directory (Debian's and Ubuntu's package default).
telemetry_textfile_dir = "/var/lib/prometheus/node-exporter"
# Seconds between two driver queries (one `nvidia-smi --query-gpu` call, ~45 ms on an H200);
# Xid reports are written as soon as the kernel logs them.
telemetry_interval = 5
# Seconds a driver query may take before it counts as failed.
telemetry_smi_timeout = 10
# The kernel-message source the collector follows for Xid reports: /dev/kmsg, or a file of
# /dev/kmsg records (the testbed injects faults through one).
telemetry_kmsg_path = "/dev/kmsg"
# Seconds from one inference probe round to the next (one real inference per ready model).
probe_interval = 5
# Seconds each probe request (repository index, model config, inference) may take.
probe_timeout = 10
# Probe inferences of a model that fail in a row before TritonInferenceProbeFailing fires (and
# the host is quarantined).
monitor_probe_failures = 2
# Alert (warning) when a GPU's temperature stays above this many degrees C for 5 minutes.
monitor_gpu_temperature_c = 85
# Xid numbers whose report quarantines the host whatever NVIDIA's Xid catalog recommends for them.
# Without them the rules follow the catalog: an Xid whose immediate action is a GPU reset, a reboot
# or a hardware check (48, 64, 79, 95 among them) quarantines, one the catalog leaves to the
# application warns, one it says to ignore raises nothing (docs/operations.md, "Xid reports").
quarantine_xids = []
# At most this many hosts of an inventory group quarantined at once: a number, or "P%" of the
# group's hosts (rounded down); beyond it a quarantine alert only alerts. The strictest value of
# the group's hosts counts.
quarantine_budget = 1
# The quarantine receiver's URL as this machine reaches it (e.g. "http://127.0.0.1:9095"):
# `tritonfleet status` shows quarantined hosts from it; None: status does not ask.
quarantine_url = None
# Seconds between two rounds of the receiver (re-reading Alertmanager, returning hosts whose
# alerts resolved, re-draining a quarantined host something put back).
quarantine_check_interval = 5
# Seconds the warm inference gate may take before a quarantined host goes back (live, ready,
# every model ready, one inference per model).
quarantine_gate_timeout = 60
# The file with the quarantine receiver's bearer token (`tritonfleet quarantine token --out`
# writes it, mode 0600): `serve` requires it on every request that changes state or reads the
# fleet; `status`, `quarantine list|hold|release` send it.
quarantine_token_file = "/etc/tritonfleet/quarantine.token"
# Seconds a quarantine alert must be missing from Alertmanager's answers (and in two reads at
# least) before the receiver counts it resolved: a restarted Alertmanager answers an empty list
# until its rules fire again, which must not return every quarantined host. A webhook's explicit
# "resolved" counts at once.
quarantine_resolve_grace = 60
# The quarantine's circuit breaker (docs/operations.md, "The circuit breaker"): when more than
# this share of an inventory group's hosts report a quarantine fault within
# quarantine_breaker_window seconds, the fault is taken for the fleet's (a driver, a model, a
# rack), not each host's: no more host of the group is taken out (the alerts only alert, and the
# receiver says so in its log, its metrics and `quarantine list`); recovered hosts still return.
# 0.5 with 300 s is NVSentinel's default (more than 50% of the nodes in 5 minutes); 1 never trips.
quarantine_breaker_fraction = 0.5
# Seconds of the breaker's window: the faults counted are those seen within it; once the breaker
# closes, an alert whose fault is older than it is not acted on (acknowledged, with an event).
quarantine_breaker_window = 300
# Seconds after a quarantined host came back into service (after a GPU reset, a reboot, its
# alerts resolving or an operator's release) within which a new fault holds it for an operator
# (its evidence collected: the driver's bug report, else the kernel log) instead of remediating
# it again (docs/operations.md, "Remediation"). Read with quarantine_remediate only.
quarantine_refault_window = 3600
# True: the quarantine receiver remediates a host whose fault's recommended action is a GPU
# reset (drain, stop Triton's unit, `nvidia-smi -r` with persistence mode handled, start it,
# warm gate, return), over SSH as the inventory reaches the host (root, or `_sudo` in its data);
# a fault the reset does not clear, or one that asks for a reboot, is said and the host stays out.
# False: quarantined hosts wait for their alerts to resolve or an operator (docs/operations.md).
quarantine_remediate = False
# The quarantine receiver's URL as the GPU hosts reach it (e.g. "http://10.0.0.5:9095"): each
# host's GPU fault collector POSTs a critical Xid report there at once (the direct path, under a
# second from the fault line to out of rotation), beside the Prometheus and Alertmanager path
# that stays the record and the budget's keeper (docs/operations.md, "The direct path"); the
# receiver runs with `serve --push-secret-file`. None: no direct path.
quarantine_push_url = None
# The push secret's file on the control machine (`tritonfleet quarantine token --out` writes one,
# mode 0600): the telemetry step gives each host the HMAC of its name under it, and the
# receiver's `serve --push-secret-file` checks it, so a host can report faults of itself only.
quarantine_push_secret_file = "/etc/tritonfleet/quarantine-push.secret"
# Where each host keeps its own push token (mode 0600, root's; the collector reads it).
quarantine_push_token_path = "/etc/tritonfleet/gpu-push.token"
# Seconds a pushed fault stands at the receiver without the Prometheus path's alert for the same
# host: once that alert arrives it takes over (the record); a push nothing confirms within this
# long is dropped, and the host returns through the warm gate like any other.
quarantine_push_ttl = 120
# --- Settings check (tritonfleet/settings/check.py) ----------------------------------------
# Names of host data that tritonfleet does not read (your own deploy code's): the settings check,
# which refuses any other name that is no tunable, no gpu_class and no pyinfra setting (a
# misspelling, shown with the nearest known name), leaves them alone.
extra_host_data = []

# --- Pull mode (tritonfleet bootstrap, tritonfleet pull, tritonfleet converge) ---------------
# Seconds between a self-converging host's looks at its desired release (its systemd timer, from
# the end of one run to the next): a release published for it starts within about this; a look
# is one conditional HTTP GET of a small file.
pull_poll_interval = 60
# Seconds after which a self-converging host runs its deploy again with no new release: drift
# on the host is put back within this (a converged host's run changes nothing).
pull_converge_interval = 1800
# Seconds a pull-mode rollout waits for each batch's hosts to report their run of the new
# release (a poll interval, the deploy, its health gate) before it counts a silent host failed.
pull_report_timeout = 900
# Seconds a signed release pointer stays valid after it was signed: a host refuses an expired
# pointer and reports a stale origin (an origin, or a man in the middle, that keeps serving an old
# pointer is seen within this), so `tritonfleet pull refresh` must re-sign the live pointers well
# within it (a daily timer against 7 days leaves a week of control-machine outage before hosts
# stop following).
pull_pointer_ttl = 604800
# Bytes a self-converging host downloads at most for a release archive or image archive whose
# size its signed pointer does not declare (the declared size caps the rest): a hostile origin
# cannot fill the host's disk. Pointers and signers documents are capped at 1 MiB.
pull_download_limit = 8589934592  # 8 GiB
# The node exporter textfile a self-converging host writes its state to (last run, result,
# release), for Prometheus; Debian's prometheus-node-exporter reads *.prom in
# /var/lib/prometheus/node-exporter (its README.textfile). "": none.
pull_textfile = "/var/lib/prometheus/node-exporter/tritonfleet_pull.prom"

# ------------------------------------------------------------------------------------------
# (not a tunable) every tunable above by name; read through tritonfleet.settings.access
DEFAULTS = {_name: _value for _name, _value in dict(globals()).items() if _name[0].islower()}
