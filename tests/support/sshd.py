"""testing.sshd, under the name the tests have always imported it by (testing/ is shared with bench/)."""

from testing.sshd import SSHD, SshServer, free_port, keygen, start_sshd, two_free_ports

__all__ = ["SSHD", "SshServer", "free_port", "keygen", "start_sshd", "two_free_ports"]
