// Opening a matrix cell opens its details below; the #cell-... fragment does the same on load.
(function () {
  function openCell(id) {
    var details = document.getElementById(id);
    if (!details || details.tagName !== "DETAILS") return;
    details.open = true;
    var old = document.querySelector("td.cell.selected");
    if (old) old.classList.remove("selected");
    var link = document.querySelector('a[data-cell="' + CSS.escape(id) + '"]');
    if (link) link.parentNode.classList.add("selected");
  }
  document.getElementById("matrix").addEventListener("click", function (event) {
    var link = event.target.closest("a[data-cell]");
    if (link) openCell(link.getAttribute("data-cell"));
  });
  function fromHash() { if (location.hash.length > 1) openCell(decodeURIComponent(location.hash.slice(1))); }
  window.addEventListener("hashchange", fromHash);
  fromHash();
})();
