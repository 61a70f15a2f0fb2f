from scalestudy.cli import main

raise SystemExit(main())
