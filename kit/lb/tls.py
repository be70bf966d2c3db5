"""TLS on the client port (--tls-cert, --tls-key; router.tls): the certificate chain and key
are read from files on the router host, never from the command line, and read again on SIGHUP
(`pdkit up` sends it): new connections get the new certificate, open ones keep theirs, none is
dropped. A reload that fails (a half-written file) keeps the old certificate and says why."""

from __future__ import annotations

import logging
import ssl

from kit.lb.errors import LbError

log = logging.getLogger("kit.lb")


class ServerTls:
    """The server side's SSL context and where its certificate and key come from."""

    def __init__(self, cert_file: str, key_file: str) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.reloads = 0
        try:
            self._load()
        except (OSError, ssl.SSLError) as exc:
            raise LbError(
                f"cannot read the TLS certificate {cert_file} with key {key_file}: {exc}. "
                "To fix: check router.tls (files on the router host, PEM, the key matching)."
            ) from exc

    def _load(self) -> None:
        # Checked on a scratch context first: a key that does not match would leave the live
        # one half changed. Then on the live context: the sockets of open connections hold
        # their own SSL objects and do not see it; handshakes from now on do.
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
            self.cert_file, self.key_file
        )
        self.context.load_cert_chain(self.cert_file, self.key_file)

    def reload(self) -> bool:
        """Read the files again (SIGHUP); False, the old certificate kept, when they fail."""
        try:
            self._load()
        except (OSError, ssl.SSLError) as exc:
            log.error("TLS reload failed, keeping the previous certificate: %s", exc)
            return False
        self.reloads += 1
        log.info("TLS certificate %s read again", self.cert_file)
        return True
