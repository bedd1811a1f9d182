"""Kernel safety: the kernel that will boot must have the NVIDIA module before the deploy reboots
(tritonfleet.host.boot_kernel, tritonfleet.host.ops.reboot), and `tritonfleet status` shows a pending reboot.
Real runs: tests/testbed/test_kernel.py (the kernel drill)."""

from __future__ import annotations

import re

from tests.support.fakehost import run_fake
from tests.unit.steps.test_steps_fake import BASE, DATA, NO_COMMUNICATION
from tritonfleet.host import boot_kernel as kernel
from tritonfleet.steps.host_prep import nvidia_driver

REBOOT = "( sleep 1 && reboot )"
KEY = 'echo "running=$r"'


def test_parse_and_summary():
    st = kernel.parse(["running=6.1.0-28-amd64", "boot=6.1.0-29-amd64", "module=no", "reboot=yes",
                       "pkgs=linux-image-6.1.0-29-amd64 ", "dkms=nvidia/580.159.04, 6.1.0-28-amd64, x86_64: installed;"])
    assert (st.boot, st.has_module, st.reboot_required) == ("6.1.0-29-amd64", False, True)
    assert st.reboot_packages == ["linux-image-6.1.0-29-amd64"]
    assert st.summary() == "pending into 6.1.0-29-amd64, WITHOUT the NVIDIA module"
    assert kernel.parse(["running=a", "boot=a", "module=yes", "reboot=no"]).summary() == "-"
    assert kernel.parse(["running=a", "boot=a", "module=yes", "reboot=yes"]).summary() == \
        "pending, with the NVIDIA module"
    built = kernel.parse(["running=a", "boot=b", "step=install linux-headers-$k", "out=Setting up ...",
                          "module=built"])
    assert built.has_module and built.steps == ["install linux-headers-$k"] and built.output == ["Setting up ..."]


def test_refusal_names_the_kernels_and_the_fix():
    st = kernel.parse(["running=6.1.0-28-amd64", "boot=6.1.0-29-amd64", "module=no", "headers=no", "dkms="])
    found, now, fix = kernel.refusal(st, ["linux-headers-{kernel}"])
    assert "6.1.0-29-amd64" in found and "running: 6.1.0-28-amd64" in found and "linux-headers-6.1.0-29-amd64" in found
    assert "not rebooted" in now and "6.1.0-28-amd64" in now
    assert "dkms autoinstall -k 6.1.0-29-amd64" in fix and "linux-image-6.1.0-29-amd64" in fix


def test_ensure_command_installs_the_boot_kernels_headers_through_the_template():
    cmd = kernel.ensure_command(["linux-headers-{kernel}"], "apt-get install -y @WORDS@")
    assert "apt-get install -y linux-headers-$k" in cmd and "dkms autoinstall -k \"$k\"" in cmd
    assert "@WORDS@" not in cmd
    assert "install" not in kernel.status_command().replace("dkms", "")  # the read side changes nothing


def _mismatch(answer: list[str]) -> dict:
    return {**BASE, KEY: answer, "nvidia-smi --query-gpu=driver_version": NO_COMMUNICATION}  # KEY stays first


def test_no_module_for_the_boot_kernel_no_reboot():
    answer = ["running=6.1.0-28-amd64", "boot=6.1.0-29-amd64", "step=install linux-headers-6.1.0-29-amd64",
              "out=E: Unable to locate package linux-headers-6.1.0-29-amd64", "module=no", "dkms=", "headers=no"]
    _, cmds, state = run_fake(nvidia_driver, _mismatch(answer), {**DATA, "nvidia_reboot_timeout": 1})
    assert state.failed_hosts
    assert not any(REBOOT in c for c in cmds)
    check = next(c for c in cmds if KEY in c)
    assert re.search(r"apt-get install -y -q linux-headers-\$k", check)  # tried to build it first


def test_status_shows_a_pending_reboot_into_a_kernel_without_the_module():
    from tritonfleet.fleet import probe

    class FH:
        name, address, gpu_class = "h", "10.0.0.2", "t4"

    text = "\n".join(["@active", "active", "@kernel", "running=6.1.0-28-amd64", "boot=6.1.0-29-amd64", "module=no", "reboot=yes",
                      "pkgs=linux-image-6.1.0-29-amd64", "dkms="])
    st = probe.interpret(FH(), probe.parse(text))
    assert st.reboot == "pending into 6.1.0-29-amd64, WITHOUT the NVIDIA module"
    assert any("pending reboot into kernel 6.1.0-29-amd64, which has no NVIDIA module" in d
               for d in probe.drift(st, {}))
    ok = probe.interpret(FH(), probe.parse(text.replace("module=no", "module=yes")))
    assert ok.reboot == "pending into 6.1.0-29-amd64, with the NVIDIA module" and not probe.drift(ok, {})


def test_the_module_is_found_under_nvidias_name_and_debians(tmp_path):
    """The boot kernel's module: NVIDIA's nvidia.ko (DKMS or precompiled) and Debian's own build,
    renamed nvidia-current.ko (its dkms.conf: DEST_MODULE_NAME), count; another module does not."""
    import subprocess

    def module_for(files: list[str]) -> str:
        root = tmp_path / str(len(list(tmp_path.iterdir())))
        for f in files:
            (root / "lib/modules/k1" / f).parent.mkdir(parents=True, exist_ok=True)
            (root / "lib/modules/k1" / f).write_text("")
        cmd = kernel.status_command().replace("/lib/modules", f"{root}/lib/modules") \
            .replace("/boot/", f"{root}/boot/").replace("r=$(uname -r)", "r=k1")
        out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True).stdout
        return kernel.parse(out.splitlines()).module

    assert module_for([]) == "no"
    assert module_for(["kernel/drivers/video/nouveau.ko", "updates/dkms/nvidia-uvm.ko"]) == "no"
    assert module_for(["updates/dkms/nvidia.ko"]) == "yes"
    assert module_for(["kernel/drivers/video/nvidia.ko.xz"]) == "yes"
    assert module_for(["updates/dkms/nvidia-current.ko"]) == "yes"
