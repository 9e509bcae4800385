(function () {
  var nodes = document.querySelectorAll('script[type="application/json"][data-figure]');
  nodes.forEach(function (node) {
    var div = document.getElementById(node.getAttribute('data-figure'));
    function fail(e) { div.textContent = 'This chart failed to render: ' + e; console.error(e); }
    try {
      var fig = JSON.parse(node.textContent);
      Plotly.newPlot(div, fig.data, fig.layout,
        {displaylogo: false, responsive: true, modeBarButtonsToRemove: ['lasso2d', 'select2d']})
        .catch(fail);
    } catch (e) { fail(e); }
  });
})();
