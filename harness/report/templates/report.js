// "non-PASS only": hides the matrix's and the requirement view's rows where everything PASSed;
// the choice is kept in the URL (#non-pass), so a link shares it.
(function () {
  var box = document.getElementById("non-pass-only");
  function apply() {
    var rows = document.querySelectorAll('tr[data-all-pass="yes"]');
    for (var i = 0; i < rows.length; i++) rows[i].hidden = box.checked;
  }
  function fromHash() { box.checked = location.hash === "#non-pass"; apply(); }
  box.addEventListener("change", function () {
    history.replaceState(null, "", box.checked ? "#non-pass" : location.pathname + location.search);
    apply();
  });
  window.addEventListener("hashchange", fromHash);
  window.addEventListener("pageshow", fromHash);  // back/forward restores the page: follow its URL
  fromHash();
})();
