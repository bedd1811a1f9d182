# Test deploy: one long remote command (the deploy lock is taken by pyinfra_patches.install(), as
# in every real deploy). Marks /var/tmp/tf-slow-started on the host when the command starts.
from pyinfra import host
from pyinfra.operations import server

from tritonfleet import pyinfra_patches

pyinfra_patches.install()  # connection keepalives and the deploy lock

seconds = int(host.data.get("slow_seconds") or 20)
server.shell(name=f"a command that runs {seconds}s",
             commands=[f"rm -f /var/tmp/tf-slow-started; touch /var/tmp/tf-slow-started; sleep {seconds}; "
                       "rm -f /var/tmp/tf-slow-started"])
