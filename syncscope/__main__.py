from syncscope.cli import main

raise SystemExit(main())
