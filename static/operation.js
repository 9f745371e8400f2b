// Live operation page: follows GET /api/v1/operations/{id}/watch (the
// API's event stream; the console session authenticates it) and appends
// each new event to the timeline. When the operation ends the state badge
// changes, the cancel form goes and a link reloads the page for the result.
// Text only: every value goes in with textContent, never as markup.
(function () {
  "use strict";
  var root = document.querySelector("[data-watch]");
  var rows = document.querySelector("[data-events]");
  if (!root || !rows || !window.EventSource) {
    return;
  }
  var status = document.querySelector("[data-live-status]");
  var seen = 0;
  rows.querySelectorAll("tr[data-cursor]").forEach(function (tr) {
    var c = Number(tr.getAttribute("data-cursor"));
    if (c > seen) {
      seen = c;
    }
  });
  var ends = { succeeded: true, failed: true, cancelled: true };
  var types = ["submitted", "running", "succeeded", "failed", "cancelled", "cancel_requested",
    "recovered", "fanned_out", "released"];

  function say(text) {
    if (status) {
      status.textContent = text;
    }
  }

  function cell(text, cls) {
    var td = document.createElement("td");
    if (cls) {
      td.className = cls;
    }
    td.textContent = text;
    return td;
  }

  function stamp(iso) {
    var d = new Date(iso);
    if (isNaN(d.getTime())) {
      return iso;
    }
    return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC").replace(/Z$/, " UTC");
  }

  function setState(state) {
    var badge = document.querySelector("[data-live-state] [data-state]");
    if (!badge) {
      return;
    }
    badge.textContent = state;
    badge.setAttribute("data-state", state);
    badge.className = "badge badge-state-" + state;
  }

  function append(e) {
    var tr = document.createElement("tr");
    tr.setAttribute("data-testid", "event-row");
    tr.setAttribute("data-cursor", e.cursor);
    var when = document.createElement("td");
    when.className = "nowrap small";
    var t = document.createElement("time");
    t.setAttribute("datetime", e.at);
    t.textContent = stamp(e.at);
    when.appendChild(t);
    tr.appendChild(when);
    var type = document.createElement("td");
    var code = document.createElement("code");
    code.setAttribute("data-testid", "event-type");
    code.textContent = e.type;
    type.appendChild(code);
    tr.appendChild(type);
    var data = e.data === null || JSON.stringify(e.data) === "{}" ? "" : JSON.stringify(e.data);
    tr.appendChild(cell(data, "mono small break event-data"));
    rows.appendChild(tr);
  }

  var source = new EventSource(root.getAttribute("data-watch"));

  function ended(state) {
    source.close();
    if (state) {
      setState(state);
    }
    document.querySelectorAll("[data-live-hide]").forEach(function (el) {
      el.hidden = true;
    });
    if (status) {
      status.textContent = "The operation ended. ";
      var a = document.createElement("a");
      a.href = window.location.pathname;
      a.textContent = "Reload for its result";
      a.setAttribute("data-testid", "live-reload");
      status.appendChild(a);
    }
  }

  function onEvent(msg) {
    var e;
    try {
      e = JSON.parse(msg.data);
    } catch (err) {
      return;
    }
    var c = Number(e.cursor);
    if (c > seen) {
      seen = c;
      append(e);
    }
    if (ends[e.type]) {
      ended(e.type);
    } else if (e.type === "running") {
      setState("running");
    }
  }

  types.forEach(function (t) {
    source.addEventListener(t, onEvent);
  });
  source.addEventListener("draining", function () {
    source.close();
    say("The server is restarting: reload the page in a moment to follow the operation again.");
  });
  source.addEventListener("open", function () {
    root.setAttribute("data-live", "open");
    say("Live: events appear below as they are recorded.");
  });
  source.addEventListener("error", function () {
    if (source.readyState === EventSource.CLOSED) {
      say("The live view stopped: reload the page to see new events.");
    } else {
      say("Reconnecting to the live view…");
    }
  });
})();
