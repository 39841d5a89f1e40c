"""The controller's heart monitor, beating slowly but registering a new engine at once.

ipyparallel's heart monitor pings every engine each period, and an engine's registration ends
only at the beat after its heart first answered: up to two periods. nbdist wants both a slow
beat (every engine and the monitor wake at each one: at 200 ms, eight idle engines cost 3 % of a
core) and registration within milliseconds (a cluster's start, a lost rank's replacement).
This monitor pings on an XPUB socket, which tells it when a new heart subscribes: it pings again
at once, and a heart answering for the first time is registered at its answer, not at the next
beat. Death is still judged at the regular beats alone, so an extra ping never counts a miss.

``install()`` puts it in ipyparallel's place, in the controller process before it starts (the
monitor's process is forked from it). Imports ipyparallel, and nothing of nbdist.
"""

from __future__ import annotations

import logging

import zmq
from ipyparallel.controller import heartmonitor as _ipp
from ipyparallel.util import bind, connect, set_hwm
from zmq.eventloop.zmqstream import ZMQStream

_SUBSCRIBE = b"\x01"  # an XPUB's message when a subscriber joins


class QuickHeartMonitor(_ipp.HeartMonitor):
    """ipyparallel's monitor, plus: a ping as soon as a heart subscribes, and a heart's first
    answer registers it."""

    def start(self) -> None:
        super().start()
        self.ping_stream.on_recv(self._subscribed)

    def _subscribed(self, msg: list[bytes]) -> None:
        if any(part[:1] == _SUBSCRIBE for part in msg):
            # the same ping again: hearts that already answered it just answer twice
            self.ping_stream.send(str(self.lifetime).encode("ascii"))
            self.ping_stream.flush()

    def handle_pong(self, msg: list[bytes]) -> None:
        super().handle_pong(msg)
        heart = msg[0]
        if heart in self.responses and heart not in self.hearts:
            self.handle_new_hearts({heart})  # the hub finishes its registration now


async def _setup(
    ctx,
    ping_url,
    pong_url,
    monitor_url,
    log_level=logging.INFO,
    curve_publickey=None,
    curve_secretkey=None,
    **heart_monitor_kwargs,
):
    """ipyparallel's ``_setup_heartmonitor``, with an XPUB (verbose: every subscriber is told)
    for the pings and ``QuickHeartMonitor``."""
    ping_socket = ctx.socket(zmq.XPUB)
    ping_socket.setsockopt(zmq.XPUB_VERBOSE, 1)
    bind(ping_socket, ping_url, curve_publickey=curve_publickey, curve_secretkey=curve_secretkey)
    pong_socket = ctx.socket(zmq.ROUTER)
    set_hwm(pong_socket, 0)
    bind(pong_socket, pong_url, curve_publickey=curve_publickey, curve_secretkey=curve_secretkey)
    monitor_socket = ctx.socket(zmq.XPUB)
    connect(
        monitor_socket,
        monitor_url,
        curve_publickey=curve_publickey,
        curve_secretkey=curve_secretkey,
        curve_serverkey=curve_publickey,
    )
    from ipyparallel.controller.app import IPController  # logging set up again after the fork

    app = IPController(log_level=log_level)
    QuickHeartMonitor(
        ping_stream=ZMQStream(ping_socket),
        pong_stream=ZMQStream(pong_socket),
        monitor_stream=ZMQStream(monitor_socket),
        log=app.log,
        **heart_monitor_kwargs,
    ).start()


def install() -> bool:
    """Use ``QuickHeartMonitor`` in this controller; False (ipyparallel's own monitor stays)
    where this ipyparallel's monitor is not set up as the one this was written for."""
    if not hasattr(_ipp, "_setup_heartmonitor") or not hasattr(_ipp, "start_heartmonitor"):
        return False
    _ipp._setup_heartmonitor = _setup
    return True
