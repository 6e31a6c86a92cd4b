// agenttx ui: live pages. A page whose <main> carries data-live="N" asks the server for the
// same URL every N seconds, with the header X-Agenttx-Live: 1 (the server then answers with
// the changing part only), and puts the answer in #live. It leaves #live alone while a
// person is at work in the page (a field of a form has the focus or was changed, or the
// pointer is over a form or a button of #live: a refresh must not move another request's
// button under it), and stops on an error.
"use strict";
(function () {
  var main = document.getElementById("page");
  var live = document.getElementById("live");
  if (!main || !live || !main.dataset.live) { return; }
  var seconds = Number(main.dataset.live) || 2;
  function busy() {
    var active = document.activeElement;
    if (active && (live.contains(active) || active.closest("form")) &&
        /^(INPUT|TEXTAREA|SELECT|BUTTON)$/.test(active.tagName)) {
      return true;
    }
    if (live.querySelector("button:hover, form:hover")) { return true; }
    var fields = live.querySelectorAll("textarea, input");
    for (var i = 0; i < fields.length; i++) {
      var field = fields[i];
      if (field.type !== "hidden" && field.value !== field.defaultValue) { return true; }
    }
    return false;
  }
  function refresh() {
    if (busy()) { setTimeout(refresh, seconds * 1000); return; }
    fetch(window.location.href, {
      headers: { "X-Agenttx-Live": "1" },
      credentials: "same-origin",
      cache: "no-store"
    }).then(function (response) {
      if (!response.ok) { throw new Error(String(response.status)); }
      return response.text();
    }).then(function (html) {
      if (!busy()) {
        live.innerHTML = html;
        main.dataset.refreshed = String(Date.now());
      }
      setTimeout(refresh, seconds * 1000);
    }).catch(function () {
      main.dataset.liveStopped = "1";
    });
  }
  setTimeout(refresh, seconds * 1000);
})();
