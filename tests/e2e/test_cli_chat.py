#!/usr/bin/env python3
"""`lumen chat` driven through a pseudo-terminal, as a person would use it.

usage: test_cli_chat.py LUMEN_BINARY

With smollm2-135m (greedy, so the answers are fixed):
  1. turn 1 tells the model a secret word; turn 2 asks for it: the answer names it,
     and the statistics show the second prompt reused the first turn's tokens;
  2. /reset, then the same question: the word is gone (so turn 2 knew it from turn 1);
  3. a long answer is interrupted with Ctrl-C: "(stopped)", and the chat goes on;
  4. /exit leaves with status 0.
Exit 77 (skipped) when the model has not been pulled."""
import os
import pty
import re
import select
import sys
import time

MODEL = "smollm2-135m"
WORD = "PINEAPPLE"


def model_present():
    home = os.environ.get("LUMEN_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "lumen")
    d = os.path.join(home, "models", MODEL)
    return os.path.isdir(d) and any(f.endswith(".gguf") for f in os.listdir(d))


class Term:
    def __init__(self, argv):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execv(argv[0], argv)
        self.buf = b""

    def read_until(self, pattern, timeout=120):
        """Reads until `pattern` (a regex on bytes) matches the unread output; returns
        the output up to the end of the match and consumes it."""
        deadline = time.time() + timeout
        rx = re.compile(pattern)
        while True:
            m = rx.search(self.buf)
            if m:
                out, self.buf = self.buf[: m.end()], self.buf[m.end():]
                return out
            left = deadline - time.time()
            if left <= 0:
                raise AssertionError("timed out waiting for %r; got %r" % (pattern, self.buf[-2000:]))
            r, _, _ = select.select([self.fd], [], [], min(left, 1.0))
            if r:
                try:
                    data = os.read(self.fd, 4096)
                except OSError:
                    data = b""
                if not data:
                    raise AssertionError("lumen chat ended while waiting for %r; got %r" % (pattern, self.buf[-2000:]))
                self.buf += data

    def send(self, text):
        os.write(self.fd, text.encode())

    def wait(self, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                r, _, _ = select.select([self.fd], [], [], 0.2)
                if r:
                    os.read(self.fd, 4096)
            except OSError:
                pass
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
        os.kill(self.pid, 9)
        raise AssertionError("lumen chat did not exit")


STATS = rb"\[prompt (\d+) tokens \((\d+) cached\)[^\]]*\]"


def turn(t, message):
    """Sends a message; returns (answer text, prompt tokens, cached tokens)."""
    t.send(message + "\n")
    out = t.read_until(STATS)
    t.read_until(rb"> ")
    m = re.search(STATS, out)
    return out.decode("utf-8", "replace"), int(m.group(1)), int(m.group(2))


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    if not model_present():
        print("SKIPPED: %s not pulled (lumen pull %s)" % (MODEL, MODEL))
        return 77
    lumen = os.path.abspath(sys.argv[1])
    t = Term([lumen, "chat", MODEL, "--temp", "0", "-n", "40", "-t", "2"])
    t.read_until(rb"> ")

    a1, p1, c1 = turn(t, "The secret word is %s. Just say OK." % WORD)
    a2, p2, c2 = turn(t, "What is the secret word?")
    print("turn 1: prompt %d tokens, %d cached" % (p1, c1))
    print("turn 2: prompt %d tokens, %d cached; answer: %r" % (p2, c2, a2[:200]))
    assert c1 == 0, "the first turn has nothing to reuse"
    assert p2 > p1, "the second prompt holds the first turn"
    assert c2 >= p1, "the second turn reused the first turn's tokens (%d cached < %d)" % (c2, p1)
    assert WORD in a2, "the second answer uses the first turn's context"

    t.send("/reset\n")
    t.read_until(rb"\(conversation forgotten\)")
    t.read_until(rb"> ")
    a3, p3, c3 = turn(t, "What is the secret word?")
    print("after /reset: prompt %d tokens; answer: %r" % (p3, a3[:200]))
    assert p3 < p2 and WORD not in a3, "/reset forgot the conversation"

    # Ctrl-C stops a long answer; the program goes on
    t.send("Write a very long story about a dragon and a knight, with many chapters.\n")
    t.read_until(rb"chapters\.\r?\n")  # our own line, echoed
    t.read_until(rb"\w+ \w+ \w+")  # the answer is streaming
    t.send("\x03")
    t.read_until(rb"\(stopped\)")
    out = t.read_until(STATS)
    assert b"cancelled" in out, out
    t.read_until(rb"> ")
    # and the chat still answers
    a4, _, _ = turn(t, "What is 2 + 2?")
    assert a4.strip(), "an answer after Ctrl-C"

    t.send("/exit\n")
    rc = t.wait()
    assert rc == 0, "exit status %d" % rc
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
