// First-run setup: the server logs a one-time link /console/setup#<token>.
// The token travels in the fragment, so it never reaches a server log; this
// script copies it into the form and removes it from the address bar.
(function () {
  "use strict";
  var hash = window.location.hash;
  if (hash.length < 2) {
    return;
  }
  var field = document.getElementById("setup_token");
  if (!field) {
    return;
  }
  field.value = decodeURIComponent(hash.slice(1));
  if (window.history && window.history.replaceState) {
    window.history.replaceState(null, "", window.location.pathname + window.location.search);
  }
  var next = document.getElementById("username");
  if (next && !next.value) {
    next.focus();
  }
})();
