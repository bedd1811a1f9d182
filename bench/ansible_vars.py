"""Write an Ansible inventory whose host variables are exactly what tritonfleet's deploy uses for
the same hosts (read from the pyinfra inventory and group data, computed by tritonfleet's own
functions), so bench/ansible/triton.yml runs the same steps with the same values.

    python bench/ansible_vars.py INVENTORY OUT_DIR [--limit HOST,...]
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from pyinfra.context import ctx_host


def host_vars(fh) -> dict:
    from pyinfra import host
    from pyinfra.facts.server import KernelVersion

    from tritonfleet.gpu.rules import GPU_CLASSES
    from tritonfleet.host import layer as host_layer
    from tritonfleet.host import vendor_repos
    from tritonfleet.host.facts import PRIMARY_FPR_AWK, DpkgState
    from tritonfleet.host.ops.apt_repo import fetch_key_command
    from tritonfleet.model_repo import render as models
    from tritonfleet.serving.images import image_id
    from tritonfleet.serving.unit import render_unit, unit_context
    from tritonfleet.settings import access as config
    from tritonfleet.steps import host_prep, verify

    with ctx_host.use(fh.pyinfra_host):
        cuda, toolkit = vendor_repos.cuda(config.current()), vendor_repos.container_toolkit(config.current())
        kernel = host.get_fact(KernelVersion)
        version = config.get("container_toolkit_version")
        local, _, rid = models.current_host_repository(config.current())
        image = config.get("triton_image")
        archive = (config.get("image_archives") or {}).get(image)
        gpu_class = str(config.get("gpu_class")).upper()
        pin = "".join(f"Package: {p}\nPin: version {version}\nPin-Priority: 1001\n\n"
                      for p in host_prep.TOOLKIT_PACKAGES)
        docker = (["docker.io", "apparmor"] if config.get("docker_source") == "distro" else
                  ["docker-ce", "docker-ce-cli", "containerd.io", "docker-buildx-plugin", "docker-compose-plugin"])
        return {
            "ansible_host": fh.address,
            "ansible_user": fh.get("ssh_user") or "root",
            "ansible_ssh_private_key_file": fh.get("ssh_key"),
            "ansible_python_interpreter": "/usr/bin/python3",
            "tf_validate_command": f"{Path(sys.executable).parent / 'tritonfleet'} validate {local}",
            "tf_secure_boot_ok": bool(config.get("nvidia_secure_boot_ok")),
            "tf_cuda_keyring": cuda.keyring,
            "tf_cuda_fingerprint": cuda.fingerprint.replace(" ", "").upper(),
            "tf_cuda_key_command": fetch_key_command(cuda.key_url, cuda.fingerprint, cuda.keyring),
            "tf_cuda_source": cuda.line + "\n",
            "tf_kernel_packages": [p.format(kernel=kernel) for p in config.get("nvidia_kernel_packages")],
            "tf_nouveau_text": host_layer.NOUVEAU_TEXT,
            "tf_driver_pin_text": host_prep.driver_pin_text(),
            # NVIDIA's pinning package pins the branch: the deploy then removes its own pin file
            "tf_driver_own_pin": host_prep.uses_own_pin(),
            "tf_driver_packages": host_prep.driver_packages(),
            "tf_held_packages": host.get_fact(DpkgState)["held"],
            "tf_unattended_text": host_layer.UNATTENDED_TEXT,
            "tf_docker_packages": docker,
            "tf_toolkit_keyring": toolkit.keyring,
            # primary keys only, as the deploy reads a keyring (a key's subkeys have fingerprints too)
            "tf_primary_fpr_awk": PRIMARY_FPR_AWK,
            "tf_toolkit_fingerprint": toolkit.fingerprint.replace(" ", "").upper(),
            "tf_toolkit_key_command": fetch_key_command(toolkit.key_url, toolkit.fingerprint, toolkit.keyring),
            "tf_toolkit_source": toolkit.line + "\n",
            "tf_toolkit_pin_text": pin,
            "tf_toolkit_packages": [f"{p}={version}" for p in host_prep.TOOLKIT_PACKAGES],
            # the same command the deploy runs (with the same gpu_verify_container mode)
            # ({% raw %}: the command holds docker's {{.Id}}, which Ansible would template)
            "tf_gpu_probe_command": "{% raw %}" + verify.probe_command(
                config.get("cuda_test_image"), mode=config.get("gpu_verify_container") or "changes") + "{% endraw %}",
            "tf_gpu_name": GPU_CLASSES[gpu_class]["names"][0],
            "tf_triton_image": image,
            "tf_triton_archive": archive or "",
            "tf_triton_image_id": image_id(Path(archive)) if archive else "",
            "tf_model_repository": str(local),
            "tf_release": rid,
            "tf_models": models.model_names(local),
            "tf_unit_text": render_unit(unit_context(config.current())),
        }


def keep_repository(v: dict, out: Path) -> dict:
    """``v`` with the model repository read from a copy under ``out``: the rendered one
    (tritonfleet.model_repo.render.render) is removed when this process ends, before the playbook runs."""
    src = v["tf_model_repository"]
    keep = out / "model_repository" / v["tf_release"]
    if not keep.is_dir():
        shutil.copytree(src, keep)
    for k in ("tf_validate_command", "tf_model_repository"):
        v[k] = v[k].replace(src, str(keep))
    return v


def main(argv: list[str]) -> int:
    from ansible_scale import config

    from tritonfleet.inventory import roster

    inventory, out = argv[0], Path(argv[1])
    limit = argv[3].split(",") if len(argv) > 3 and argv[2] == "--limit" else None
    hosts = roster.load_inventory(inventory, limit=limit)
    (out / "host_vars").mkdir(parents=True, exist_ok=True)
    try:
        for fh in hosts:
            (out / "host_vars" / f"{fh.name}.json").write_text(json.dumps(keep_repository(host_vars(fh), out),
                                                                          indent=1))
    finally:
        for fh in hosts:
            roster.disconnect(fh)
    (out / "inventory.ini").write_text("[gpu]\n" + "".join(f"{fh.name}\n" for fh in hosts))
    (out / "ansible.cfg").write_text(config(out / "inventory.ini"))
    print(f"wrote {out} for {len(hosts)} hosts")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
