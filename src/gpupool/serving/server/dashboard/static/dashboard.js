// gpupool dashboard: fetch the live part of the page again every few seconds and swap it in.
// No library: the server draws everything (HTML and SVG); this only moves it into the page.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var state = document.getElementById("state");
  var form = document.getElementById("filter");
  if (!live) {
    return;
  }
  var base = parseInt(live.getAttribute("data-refresh-ms"), 10) || 2000;
  var delay = base;
  var timer = null;
  var busy = false;
  var typing = null;

  // The filter as typed, and the charts' range as the page's address holds it (?range=, chosen by its links).
  function query() {
    var q = form && form.elements.q ? form.elements.q.value.trim() : "";
    var range = new URLSearchParams(window.location.search).get("range");
    var params = new URLSearchParams();
    if (q) {
      params.set("q", q);
    }
    if (range) {
      params.set("range", range);
    }
    var text = params.toString();
    return text ? "?" + text : "";
  }

  function show(text, bad) {
    if (state) {
      state.textContent = text;
      state.className = bad ? "state bad" : "state";
    }
  }

  function schedule() {
    clearTimeout(timer);
    timer = setTimeout(refresh, delay);
  }

  function refresh() {
    if (document.hidden) {
      schedule();
      return;
    }
    if (busy) {
      return;
    }
    busy = true;
    var started = performance.now();
    fetch("/ui/live" + query(), { credentials: "same-origin", cache: "no-store", headers: { accept: "text/html" } })
      .then(function (response) {
        if (response.status === 401) {
          window.location.reload(); // the token was rotated or revoked: back to the sign-in page
          return null;
        }
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.text();
      })
      .then(function (html) {
        if (html === null) {
          return;
        }
        live.innerHTML = html;
        // A page of thousands of GPUs takes a while to draw: never spend more than a quarter of the time on it.
        delay = Math.max(base, Math.min(30000, (performance.now() - started) * 4));
        show("live · " + new Date().toLocaleTimeString(), false);
      })
      .catch(function () {
        delay = Math.min(30000, delay * 2);
        show("disconnected, retrying", true);
      })
      .then(function () {
        busy = false;
        schedule();
      });
  }

  if (form) {
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      window.history.replaceState(null, "", "/" + query());
      refresh();
    });
    form.addEventListener("input", function () {
      clearTimeout(typing);
      typing = setTimeout(function () {
        window.history.replaceState(null, "", "/" + query());
        refresh();
      }, 300);
    });
  }
  document.addEventListener("visibilitychange", function () {
    if (!document.hidden) {
      refresh();
    }
  });
  show("live", false);
  schedule();
})();
