// A link to a raw history row (#row-N) opens the folded history first, then scrolls to the row.
(function () {
  function show() {
    if (!location.hash.startsWith("#row-")) return;
    var row = document.getElementById(decodeURIComponent(location.hash.slice(1)));
    var history = document.getElementById("history");
    if (!row || !history) return;
    history.open = true;
    row.scrollIntoView({block: "center"});
  }
  window.addEventListener("hashchange", show);
  show();
})();
