// Copy buttons: <button data-copy="ID" hidden> copies the value of the
// element with that id. Buttons stay hidden without JavaScript; the field
// can still be selected and copied by hand.
(function () {
  "use strict";
  function status(id, text) {
    var el = document.querySelector('[data-copy-status="' + id + '"]');
    if (el) {
      el.textContent = text;
    }
  }
  document.querySelectorAll("button[data-copy]").forEach(function (button) {
    var id = button.getAttribute("data-copy");
    var field = document.getElementById(id);
    if (!field) {
      return;
    }
    button.hidden = false;
    button.addEventListener("click", function () {
      field.focus();
      field.select();
      var done = function () { status(id, "Copied. Store it in your secret manager now."); };
      var fail = function () { status(id, "Copy failed: select the field and copy it by hand."); };
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(field.value).then(done, fail);
      } else {
        try {
          document.execCommand("copy") ? done() : fail();
        } catch (e) {
          fail();
        }
      }
    });
  });
})();
