"""Who may talk to a job: the job's secret, the challenge that proves it, and how strangers are reported.

- :mod:`.secret`: the secret ``ringlet run`` generates for every job and hands to its workers through
  the environment (:data:`~.secret.SECRET_ENV`), and the HMAC primitives that prove knowledge of it.
- :mod:`.handshake`: mutual challenge-response on a stream socket, for every endpoint ringlet owns.
- :mod:`.strangers`: refused connections, logged once per address.

The threat model is in ``docs/security.md``.
"""
from .handshake import AuthError, client_handshake, server_handshake
from .secret import SECRET_ENV, job_secret, new_secret, prove, verify
from .strangers import note_stranger

__all__ = ["SECRET_ENV", "job_secret", "new_secret", "prove", "verify", "AuthError", "client_handshake",
           "server_handshake", "note_stranger"]
